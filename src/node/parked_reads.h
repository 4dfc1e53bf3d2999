// ParkedReads: the local server's requests that wait without blocking its
// loop -- gets of entries only on SSD (promoted into DRAM first) and, with a
// remote source, gets and exists of keys not held here (fetched from the
// cluster, or asked of it). Park() starts that work; each piece finishes on
// some other thread, is posted back, and the loop is woken through its
// eventfd; TakeReady() then hands over the requests whose work all finished.
// A read is one TieredStore::ReadBatch: the keys DRAM holds are pinned
// then, in one hold of its lock, and the request waits only for the others.
// It is parked with its decoded keys and comes back with one pin slot per
// key (held in DRAM, promoted or fetched; empty: not found): it is answered
// from those, so it is decoded and looked up once.
//
// Thread-safety: Park() and TakeReady() on the loop thread only; the
// completions post from any thread. The executors and the remote source
// must be drained before destruction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

struct CommitCopies;  // node/local_ops.h

class ParkedReads {
 public:
  // What a parked request carries back to the loop.
  struct Request {
    int fd = -1;
    uint64_t conn_id = 0;
    protocol::FrameHeader header;
    std::vector<KeyId> keys;                // decoded: the keys, in request order
    std::vector<protocol::SizedKey> sized;  // decoded, for a get: keys with buffer sizes
    std::vector<TieredStore::Pin> pins;     // read: per key, request order; empty: not found
    uint8_t run = UINT8_MAX;                // read: TieredStore::BatchRead::run
    std::set<KeyId> remote_hits;            // exists: keys the cluster has
    Status call_status;                     // a parked call's outcome
    std::string answer;                     // and its answer (ParkCall)
    // A commit whose copies run elsewhere (ParkCall): its reservations and
    // staging, kept alive here until it is answered.
    std::shared_ptr<CommitCopies> commit;
  };

  // wake_fd: the loop's eventfd (written once per completion). remote may
  // be null. All pointers must outlive this object.
  ParkedReads(TieredStore* store, RemoteReads* remote, int wake_fd, MetricsRegistry* metrics);

  // Reads request->keys (TieredStore::ReadBatch) into request->pins. With
  // may_wait, keys only on SSD are promoted and, with a remote source, keys
  // held nowhere here are fetched; when some key waits so, the request is
  // moved into this object and comes back from TakeReady. False when it is
  // answered now, from request->pins (a key not held here: an empty pin).
  bool Read(Request* request, bool may_wait);
  // True when some key of request->keys is held nowhere here and the
  // remote source is asked for it: then the request is moved into this
  // object (remote_hits are its answer). False when it is answered now.
  bool Exists(Request* request);
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
    bool fetched = false;                // pins: the cluster's fetch (else a promotion's)
    uint32_t index = 0;                  // a promotion's: its key's
    std::vector<TieredStore::Pin> pins;  // a promotion's (one), or the fetched
    std::vector<KeyId> remote_hits;
    Status call_status;
    std::string answer;
  };
  struct Pending {
    Request request;
    size_t remaining = 0;
    std::vector<uint32_t> absent;  // a read: the indexes fetched from the cluster
  };
  // Moves *request in under id_, waiting for `waits` completions.
  Pending& Hold(uint64_t id, Request* request, size_t waits);
  void Post(Done d);

  TieredStore* const tiered_;
  RemoteReads* const remote_;
  const int wake_fd_;
  Counter* waits_;
  Counter* remote_waits_;
  std::unordered_map<uint64_t, Pending> pending_;  // loop thread
  uint64_t next_id_ = 1;                           // loop thread
  TieredStore::BatchRead batch_;                   // loop thread
  std::mutex mu_;
  std::vector<Done> done_;  // protected by mu_
};

}  // namespace kvpool
