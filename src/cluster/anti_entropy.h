// AntiEntropy: holders and homes converge by themselves after any fault.
//
// Publishing is best effort: a batch a home did not take after its retries
// (a cut link, a paused home) is dropped, and without a view change nothing
// would send it again. So every interval each holder lists its inventory
// (DRAM, then the SSD entries DRAM does not hold), sums a 64-bit digest of
// its keys per shard and sends each home a Digest of the shards it maps
// there (kPeerDigest; ~16 bytes per shard the holder has keys in). The home
// keeps the same sums per (holder, shard) as entries come and go (Directory)
// and answers the shards that differ. For those the holder asks the home's
// keys of it (kPeerShardKeys), lists its own keys of those shards again and
// fixes the difference through the HoldingsAnnouncer (Relist / Unlist), in
// queue order with its other publishes:
//   - a key it holds that the home lacks: Add, then, if the key is no longer
//     held by now, Remove -- so a remove that raced the listing still wins;
//   - a key the home lists that it does not hold: Remove, then, if the key
//     is held by now, Add again.
// A round therefore never makes a home list a key its holder dropped before
// the round's publishes were queued. Convergence: one interval plus a round
// after the fault heals. Digests also carry the holder's incarnation, and
// replies the home's, so static members learn restarted peers (Cluster::
// ObservePeer) within a round; the first round runs at Start().
//
// Thread-safety: thread-safe. Rounds run on its scheduler; the
// handlers on the transport's handler executor. Stop() the rounds before the
// cluster stops; destroy only after the cluster itself (its transport runs
// the handlers) and after the handler executor has drained, as PeerServer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/holdings_announcer.h"
#include "common/metrics.h"
#include "common/scheduler.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct AntiEntropyOptions {
  // Between rounds. Shorter converges sooner after a fault; each round lists
  // the whole inventory (CPU, and SSD header reads with an SSD tier) and
  // sends ~16 bytes per shard holding keys. 0: no rounds (handlers only).
  std::chrono::milliseconds interval{5000};
  // Deadline of each Digest / ShardKeys call.
  std::chrono::milliseconds timeout{2000};
  // Where the rounds run (null: a scheduler thread of the object's own).
  // Must outlive the object.
  Scheduler* scheduler = nullptr;

  Status Validate() const;
};

class AntiEntropy {
 public:
  // Registers the Digest and ShardKeys handlers. All pointers must outlive
  // this object; metrics must not be null.
  AntiEntropy(const AntiEntropyOptions& options, Cluster* cluster, Directory* directory,
              HoldingsAnnouncer* announcer, TieredStore* store, MetricsRegistry* metrics);
  ~AntiEntropy();
  AntiEntropy(const AntiEntropy&) = delete;
  AntiEntropy& operator=(const AntiEntropy&) = delete;

  // Starts the rounds (the first at once); no-op when interval is 0.
  void Start();
  // Ends the rounds: waits for a running one (bounded by its calls'
  // deadlines). Idempotent; the destructor calls it.
  void Stop();
  // Runs one round on the calling thread and returns when it is done.
  void RunRound();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::cluster
