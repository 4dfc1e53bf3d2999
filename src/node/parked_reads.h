// ParkedReads: the local server's requests that wait without blocking its
// loop -- gets of entries only on SSD (promoted into DRAM first) and, with a
// remote source, gets and exists of keys not held here (fetched from the
// cluster, or asked of it). Park() starts that work; each piece finishes on
// some other thread, is posted back, and the loop is woken through its
// eventfd; TakeReady() then hands over the requests whose work all finished.
// A request is parked with its decoded keys, and comes back with one pin
// per key it found (held in DRAM, promoted or fetched; Pin::key() says
// which): it is answered from those, so it is decoded and pinned once.
//
// Thread-safety: Park() and TakeReady() on the loop thread only; the
// completions post from any thread. The executors and the remote source
// must be drained before destruction.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/remote_source.h"
#include "common/metrics.h"
#include "protocol/codec.h"
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
    std::vector<KeyId> keys;                // decoded: the keys, in request order
    std::vector<protocol::SizedKey> sized;  // decoded, for a get: keys with buffer sizes
    std::vector<TieredStore::Pin> pins;     // read: one per key found, held until answered
    std::set<KeyId> remote_hits;            // exists: keys the cluster has
    Status call_status;                     // a parked call's outcome
    std::string answer;                     // and its answer (ParkCall)
  };
  enum class Kind { kRead, kExists };

  // wake_fd: the loop's eventfd (written once per completion). remote may
  // be null. All pointers must outlive this object.
  ParkedReads(TieredStore* store, RemoteSource* remote, int wake_fd, MetricsRegistry* metrics);

  // True when some key of request->keys waits: then the request is moved
  // into this object. False (nothing moved or pinned) when the request can
  // be answered now.
  bool Park(Kind kind, Request* request);
  // Parks a request answered by work done elsewhere: start(done) begins the
  // work, which calls done(status, answer) once, from any thread; the
  // request then comes back with them (call_status, answer).
  using CallDone = std::function<void(Status, std::string)>;
  void ParkCall(Request* request, const std::function<void(CallDone)>& start);
  // Requests whose waits all finished, in completion order.
  std::vector<Request> TakeReady();

 private:
  struct Done {
    uint64_t id = 0;
    std::vector<TieredStore::Pin> pins;
    std::vector<KeyId> remote_hits;
    Status call_status;
    std::string answer;
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
