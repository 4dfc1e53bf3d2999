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
// Latency is modelled, not timed: the in-process network delivers at once
// on one thread, so wall time says nothing about a cluster's. Each read
// records its calls and which call's reply each was sent from (the call
// graph the real code made), and LatencyUs replays that graph over a
// network model: per-link latency with seeded jitter, per-link bandwidth,
// and per-message CPU costs measured from the real handlers and senders of
// this run (per message type), queued per node. Membership is a view the
// simulation sets (Join, Leave); etcd's side is kvpool-etcd-load's.
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
  // Reads look up only their first key at its home and ask its holder
  // about the rest (RemoteReaderOptions::chain_reads).
  bool chain_reads = false;
};

// One call a request made, for the latency model.
struct SimCall {
  int parent = -1;            // the call from whose reply it was sent; -1: the request's start
  uint32_t from = 0, to = 0;  // node indexes
  uint16_t type = 0;
  uint64_t request_bytes = 0;
  uint64_t reply_bytes = 0;
};

// The network a call graph is replayed over.
struct LinkModel {
  double latency_us = 10;  // one way, per link
  double gbit = 100;       // per link and direction
  // Each one-way trip takes latency_us * (1 + an exponential of mean
  // jitter); one in slow_every takes slow_factor times as long on top.
  double jitter = 0.1;
  uint32_t slow_every = 1000;
  double slow_factor = 5;
};

// CPU costs per message type, in microseconds (0 for a type not seen).
struct SimCostTable {
  std::map<uint16_t, double> handler_us, send_us;
  double Handler(uint16_t type) const;
  double Send(uint16_t type) const;
};

// What one request sent, from the node that made it (its outgoing calls).
struct RequestCost {
  std::vector<SimCall> calls;  // in the order they were sent
  uint64_t messages = 0;   // calls of every type
  uint64_t lookups = 0;    // kPeerLookup
  uint64_t holder_lookups = 0;  // kPeerHolderLookup
  uint64_t fetches = 0;    // kPeerFetch
  uint64_t publishes = 0;  // kPeerPublish
  uint64_t stores = 0;     // kPeerStore
  uint64_t homes = 0;      // distinct peers sent lookups (of either kind) or publishes
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

  // Read with a reader of the given kind, whatever
  // ScaleSimOptions::chain_reads says (each node has one of each): lookups
  // at every key's home; a chain read (RemoteReaderOptions::chain_reads);
  // or a chain read that keeps what it fetched as replicas and returns
  // once their homes list them.
  enum class ReadKind { kHomes, kChain, kChainKeep };
  Status Read(size_t reader, ReadKind kind, std::span<const KeyId> keys, size_t* found,
              RequestCost* cost);

  // The CPU costs measured so far: per message type, the median wall time
  // of the real handler (at the receiver) and the tenth percentile of the
  // send's (at the sender; the rest is the in-process network's queueing).
  SimCostTable costs() const;
  // The modelled latency of a request whose calls were `calls`, in
  // microseconds, for one draw (`seed`) of the model's jitter: when its
  // last reply is in. *replied_at (when given): each call's reply time.
  static double LatencyUs(const std::vector<SimCall>& calls, const LinkModel& link,
                          const SimCostTable& costs, uint64_t seed,
                          std::vector<double>* replied_at = nullptr);

  // A view change: one node joins (a new node, with the view that lists it),
  // or node `node` crashes (it neither sends nor answers from then on) and
  // the view drops it. Every node up is given the new view at once; then
  // the keys Put stored whose home moved, held by a node still up, are
  // unreachable until a holder has told the new home (the publishers
  // flushed every 5 ms). Returns once the new home of every such key names
  // a holder that is up, or after 300 s (whole_s -1).
  static constexpr size_t kMaxJoins = 4;
  struct ViewChange {
    uint64_t shards_moved = 0;  // shards whose home changed
    uint64_t keys_moved = 0;    // keys unreachable at the change
    uint64_t keys_lost = 0;     // keys only a crashed node held
    double views_s = 0;         // giving every node the view (one after another, here)
    double whole_s = 0;         // from then until every moved key is listed again
  };
  Status Join(ViewChange* change);
  Status Leave(size_t node, ViewChange* change);

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
  Status ChangeView(const std::shared_ptr<const ShardMap>& before, ViewChange* change);
  std::unique_ptr<Impl> impl_;
};

// Shards that move when one member joins a cluster of `nodes` (or, with
// leave, when the last of nodes + 1 leaves), over the ideal share of one
// node (kNumShards / (nodes + 1)): 1.0 is a perfect consistent hash.
// Members are named as ScaleSim names them.
double ShardsMovedVsIdeal(size_t nodes, bool leave, uint64_t* moved);

}  // namespace kvpool::cluster
