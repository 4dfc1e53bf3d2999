// HomePlacer: placement "home". A value committed on this node whose key's
// home is another node is handed to that home (kPeerStore, the value sent
// from the pinned local entry without a copy); once the home has it, the
// local copy is removed, so capacity spreads over the homes. If the home
// cannot take it (dead, full, slow past the deadline), the value stays here
// and is published as a local placement would.
//
// Thread-safe; Place() is quick (a pin and an async call). Callbacks run on
// transport threads and use the store and publisher: destroy the placer
// after the cluster's transport.
#pragma once

#include <chrono>

#include "cluster/cluster.h"
#include "cluster/publisher.h"
#include "common/metrics.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

class HomePlacer {
 public:
  // All pointers must outlive the placer.
  HomePlacer(Cluster* cluster, Publisher* publisher, TieredStore* store,
             std::chrono::milliseconds timeout, MetricsRegistry* metrics);

  // The key was just committed here with `size` bytes.
  void Place(const KeyId& key, uint64_t size);

 private:
  Cluster* const cluster_;
  Publisher* const publisher_;
  TieredStore* const store_;
  const std::chrono::milliseconds timeout_;
  Counter* moved_;
  Counter* kept_;
};

}  // namespace kvpool::cluster
