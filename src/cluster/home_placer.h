// HomePlacer: placement "home". A value committed on this node whose key's
// home is another node is handed to that home (kPeerStore, the value sent
// from the pinned local entry without a copy); once the home has it, the
// local copy is removed, so capacity spreads over the homes. If the home
// cannot take it (dead, full, slow past the deadline), the value stays here
// and is published as a local placement would. So does a value put while
// the hand-offs in flight are at their byte budget: the pinned values of
// hand-offs cannot be evicted, and a writer faster than the wire would
// otherwise fill its DRAM with them and refuse puts.
//
// Thread-safe; Place() is quick (a pin and an async call). Callbacks run on
// transport threads and use the store and publisher: destroy the placer
// after the cluster's transport.
#pragma once

#include <atomic>
#include <chrono>

#include "cluster/cluster.h"
#include "cluster/publisher.h"
#include "common/metrics.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct HomePlacerOptions {
  // Deadline of one hand-off.
  std::chrono::milliseconds timeout{1000};
  // Value bytes in flight to homes at once (at least one value always may).
  uint64_t max_inflight_bytes = 64ull << 20;
};

class HomePlacer {
 public:
  // All pointers must outlive the placer.
  HomePlacer(const HomePlacerOptions& options, Cluster* cluster, Publisher* publisher,
             TieredStore* store, MetricsRegistry* metrics);
  ~HomePlacer();

  // The key was just committed here with `size` bytes.
  void Place(const KeyId& key, uint64_t size);

 private:
  Cluster* const cluster_;
  Publisher* const publisher_;
  TieredStore* const store_;
  const HomePlacerOptions opts_;
  std::atomic<uint64_t> inflight_bytes_{0};
  MetricsRegistry* const metrics_;
  Counter* moved_;
  Counter* kept_;
  Counter* busy_;
};

}  // namespace kvpool::cluster
