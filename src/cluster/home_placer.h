// HomePlacer: placement "home". A value committed on this node whose key's
// home is another node is handed to that home (kPeerStore, the value sent
// from the pinned local entry without a copy); once the home has it, the
// local copy is removed (TieredStore::Remove, told to the holdings stream as
// kHandedOff), so capacity spreads over the homes. If the home cannot take
// it (dead, full, slow past the deadline), the value stays here and the
// caller is told to announce it (the `kept` callback), as a local placement
// would be.
//
// Hand-offs pin their values until the home answers, and pinned values
// cannot be evicted: a writer faster than the wire (or a hung home) would
// fill its DRAM with them and refuse puts. So the bytes in flight are
// bounded (max_inflight_bytes). A value put while the budget is spent is
// announced here at once (readable from anywhere) and queued, unpinned; the
// queue is handed off, oldest first, as hand-offs finish. A value evicted
// while it waits is simply gone. When the queue is full (max_queued), the
// value stays here for good.
//
// The placer publishes nothing itself: Place's answer and the kept
// callback tell the holdings announcer (holdings_announcer.h) what to
// announce.
//
// Thread-safe; Place() is quick (a pin and an async call, or a queue
// push). Callbacks run on transport threads and use the store and the kept
// callback: destroy the placer after the cluster's transport.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>

#include "cluster/cluster.h"
#include <functional>

#include "common/metrics.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct HomePlacerOptions {
  // Deadline of one hand-off.
  std::chrono::milliseconds timeout{1000};
  // Value bytes in flight to homes at once (at least one value always may).
  uint64_t max_inflight_bytes = 64ull << 20;
  // Values waiting for the budget (16 + 8 bytes each).
  size_t max_queued = 65536;
};

class HomePlacer {
 public:
  // A hand-off failed: the value stays here. `announced`: Place had
  // answered kQueued for it (announced already).
  using KeptFn = std::function<void(const KeyId& key, uint64_t size, bool announced)>;

  // All pointers must outlive the placer.
  HomePlacer(const HomePlacerOptions& options, Cluster* cluster, TieredStore* store, KeptFn kept,
             MetricsRegistry* metrics);
  ~HomePlacer();

  enum class Placement {
    kHere,        // stays here (its home is this node, or no room to queue it): announce it
    kHandingOff,  // being handed to its home: announce nothing unless `kept` says so
    kQueued,      // announce it now; it is handed off later (then removed as kHandedOff)
  };
  // The key was just committed here with `size` bytes.
  Placement Place(const KeyId& key, uint64_t size);

 private:
  struct Queued {
    KeyId key;
    uint64_t size = 0;
  };
  enum class Start { kStarted, kHere, kBusy };
  // Starts the hand-off of key unless the budget is spent (kBusy). Keys
  // whose home is (now) this node stay here (kHere). `announced`: Place
  // answered kQueued.
  Start TryStart(const KeyId& key, uint64_t size, bool announced);
  // Starts queued hand-offs while the budget allows.
  void Drain();

  Cluster* const cluster_;
  const KeptFn kept_fn_;
  TieredStore* const store_;
  const HomePlacerOptions opts_;
  std::atomic<uint64_t> inflight_bytes_{0};
  std::mutex mu_;
  std::deque<Queued> queue_;  // protected by mu_
  MetricsRegistry* const metrics_;
  Counter* moved_;
  Counter* kept_;
  Counter* busy_;
  Counter* queue_full_;
};

}  // namespace kvpool::cluster
