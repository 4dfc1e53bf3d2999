// BlockIndex: the cluster's answer to a router's prefix lookup -- given a
// request's engine block hashes in order, which nodes hold the longest
// leading run of them, and in which tier -- from any node, in one call.
//
// Routers know engine block hashes, not kvpool's keys, and a connector
// derives a block's keys from its namespace, rank, group and layer layout,
// so the index is keyed by what the router knows: the engine hash as a
// 64-bit int (blocks::EngineHash64, as vLLM's int mode and Dynamo name
// blocks). A node holding a key whose writer described it with engine hash
// h in tier t (blocks/descriptor_table.h) publishes the index key
// BlockIndexKey(h, t) to that key's home -- the home of its shard, as for
// any key -- when it gains its first such key and unpublishes it when it
// loses its last. Each home keeps its index keys' holders in a Directory of
// its own (bounded; dead incarnations pruned on every view, so a node that
// dies drops out of answers within its lease; everything dropped when the
// home is fenced). Holders re-publish what they hold when a view moves an
// index key's home or they come back under a new incarnation.
//
// A lookup derives the 2n index keys of n hashes, asks their homes (at most
// max_fanout at once, all by the deadline; a home that does not answer
// counts in homes_failed and its keys as held nowhere), keeps the holders
// alive in the current view, and builds the answer (blocks/prefix.h).
//
// Engine hashes are the index's identity: two models served from one
// cluster whose engines hash the same tokens alike (one hash seed, one
// block size) share index keys, so a lookup may name a node that holds the
// other model's block. Keys written without descriptors are not indexed.
// The index is soft state without anti-entropy: a publish lost after its
// retries leaves a key unindexed (or listed) until its tier changes again.
//
// Thread-safe. OnBlockTier may run under the DRAM tier's lock (it only
// queues). Lookup blocks the caller: never call it on a transport thread.
// Destroy after the cluster (its transport runs the handlers, its
// membership the view callback), as PeerServer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>

#include "blocks/descriptor_table.h"
#include "blocks/prefix.h"
#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/publisher.h"
#include "common/executor.h"
#include "common/metrics.h"

namespace kvpool::cluster {

// The index key of engine hash `hash` in `tier`.
KeyId BlockIndexKey(uint64_t hash, blocks::BlockTier tier);

struct BlockIndexOptions {
  // Index keys this node keeps as a home (2 per block and tier held
  // somewhere: about 100 bytes each).
  uint64_t max_entries = 4u << 20;
  // How often queued publishes go out.
  std::chrono::milliseconds publish_interval{5};
  // Homes asked at once by one lookup.
  uint32_t max_fanout = 16;
  // Hashes one lookup may carry.
  uint32_t max_hashes = 4096;

  Status Validate() const;
};

class BlockIndex final : public blocks::BlockTierListener {
 public:
  // Registers the handlers and subscribes to views. All pointers must
  // outlive the index; `local` is this node's descriptor table (replays).
  BlockIndex(const BlockIndexOptions& options, Cluster* cluster,
             const blocks::DescriptorTable* local, Executor* executor, MetricsRegistry* metrics);
  ~BlockIndex() override;
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // Starts and stops the publish schedule (Stop: what is queued is not
  // sent). Stop is idempotent; the destructor calls it.
  void Start();
  void Stop();

  void OnBlockTier(uint64_t hash, blocks::BlockTier tier, bool held) override;

  // The cluster's answer for `hashes` (at most max_hashes; InvalidArgument
  // beyond) by `timeout`. Unavailable while this node is fenced.
  Result<blocks::PrefixAnswer> Lookup(std::span<const uint64_t> hashes,
                                      std::chrono::milliseconds timeout);

  // Index keys listed at this home.
  uint64_t entries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::cluster
