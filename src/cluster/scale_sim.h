// ScaleSim: N nodes' real cluster services in one process, over the
// in-process transport, for measuring what a request costs as the cluster
// grows (docs/scale.md, bench/compare.sh scale).
//
// Each node is what a kvpool-node runs for its cluster (a DRAM-only
// TieredStore, StaticMembership, Cluster, Directory, HoldingsAnnouncer with
// its Publisher, PeerServer, RemoteReader), assembled by hand as the
// cluster tests do, all sharing one thread pool and one network. Every
// node's transport is wrapped in a counter of the calls it sends (by
// message type, to which peers, and their bytes), so a request's cost is
// the difference of two snapshots. Membership is static (incarnation 0:
// no node learns a new view from a peer's publish), and lookups are never
// cached (lookup_cache_ttl 0): every read pays its lookups, as a cold read
// does.
//
// What it does not model yet: link latency and bandwidth (the network
// delivers at once, on one thread), per-message CPU cost, etcd.
//
// Not thread-safe: one caller drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/key_id.h"
#include "common/status.h"
#include "membership/shard_map.h"

namespace kvpool::cluster {

struct ScaleSimOptions {
  size_t nodes = 4;
  // Threads of the pool every node's services share.
  size_t threads = 4;
  // Each node's DRAM (a memfd it maps lazily; nothing is touched up front).
  uint64_t dram_bytes = 64ull << 20;
};

// What one request sent, from the node that made it (its outgoing calls).
struct RequestCost {
  uint64_t messages = 0;   // calls of every type
  uint64_t lookups = 0;    // kPeerLookup
  uint64_t fetches = 0;    // kPeerFetch
  uint64_t publishes = 0;  // kPeerPublish
  uint64_t stores = 0;     // kPeerStore
  uint64_t homes = 0;      // distinct peers sent lookups or publishes
  uint64_t bytes = 0;      // request and payload bytes sent
};

class ScaleSim {
 public:
  static Result<std::unique_ptr<ScaleSim>> Open(const ScaleSimOptions& options);
  ~ScaleSim();
  ScaleSim(const ScaleSim&) = delete;
  ScaleSim& operator=(const ScaleSim&) = delete;

  size_t size() const;
  const std::string& node_id(size_t node) const;

  // Stores values of `value_bytes` under keys on node `writer` and
  // publishes them to their homes; returns once every home has them.
  // *cost: what the publishing sent.
  Status Put(size_t writer, std::span<const KeyId> keys, uint64_t value_bytes, RequestCost* cost);
  // Reads keys through node `reader` (RemoteReader::Fetch: lookups at the
  // keys' homes, then a fetch from a holder each); *found gets how many
  // came back, byte-exact (the values Put wrote). *cost: what it sent.
  Status Read(size_t reader, std::span<const KeyId> keys, size_t* found, RequestCost* cost);

  // Directory entries and bytes (Directory::entries(), bytes()) summed
  // over the nodes, and the largest and smallest node's bytes.
  uint64_t directory_entries() const;
  uint64_t directory_bytes() const;
  uint64_t directory_bytes_max() const;
  // A node's membership view and shard map, as bytes it keeps.
  uint64_t membership_bytes(size_t node) const;
  // The distinct peers node has sent calls to so far (the endpoints a
  // transport that connects on demand keeps open).
  uint64_t peers_called(size_t node) const;
  // The shard map every node computed.
  std::shared_ptr<const ShardMap> shard_map() const;

  struct Impl;

 private:
  explicit ScaleSim(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Shards that move when one member joins a cluster of `nodes` (or, with
// leave, when the last of nodes + 1 leaves), over the ideal share of one
// node (kNumShards / (nodes + 1)): 1.0 is a perfect consistent hash.
// Members are named as ScaleSim names them.
double ShardsMovedVsIdeal(size_t nodes, bool leave, uint64_t* moved);

}  // namespace kvpool::cluster
