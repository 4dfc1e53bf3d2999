// ParkedReads: the local server's requests that wait without blocking its
// loop -- gets of entries only on SSD (promoted into DRAM first) and, with a
// remote source, gets and exists of keys not held here (fetched from the
// cluster, or asked of it). Park() starts that work; each piece finishes on
// some other thread, is posted back, and the loop is woken through its
// eventfd; TakeReady() then hands over the requests whose work all finished,
// holding pins on the promoted/fetched entries so they cannot be evicted
// before the request is answered.
//
// Thread-safety: Park() and TakeReady() on the loop thread only; the
// completions post from any thread. The executors and the remote source
// must be drained before destruction.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "cluster/remote_source.h"
#include "common/metrics.h"
#include "protocol/message_format.h"
#include "store/tiered_store.h"

namespace kvpool {

class ParkedReads {
 public:
  // What a parked request carries back to the loop.
  struct Request {
    int fd = -1;
    uint64_t conn_id = 0;
    protocol::FrameHeader header;
    std::vector<uint8_t> body;
    std::vector<TieredStore::Pin> pins;  // entries pinned until it is answered
    std::set<KeyId> remote_hits;       // exists: keys the cluster has
  };
  enum class Kind { kRead, kExists };

  // wake_fd: the loop's eventfd (written once per completion). remote may
  // be null. All pointers must outlive this object.
  ParkedReads(TieredStore* store, RemoteSource* remote, int wake_fd, MetricsRegistry* metrics);

  // True when some key waits (then the request is parked); false when the
  // request can be answered now.
  bool Park(Kind kind, std::span<const KeyId> keys, Request request);
  // Requests whose waits all finished, in completion order.
  std::vector<Request> TakeReady();

 private:
  struct Done {
    uint64_t id = 0;
    std::vector<TieredStore::Pin> pins;
    std::vector<KeyId> remote_hits;
  };
  struct Pending {
    Request request;
    size_t remaining = 0;
  };
  void Post(Done d);

  TieredStore* const tiered_;
  RemoteSource* const remote_;
  const int wake_fd_;
  Counter* waits_;
  Counter* remote_waits_;
  std::unordered_map<uint64_t, Pending> pending_;  // loop thread
  uint64_t next_id_ = 1;                           // loop thread
  std::mutex mu_;
  std::vector<Done> done_;  // protected by mu_
};

}  // namespace kvpool
