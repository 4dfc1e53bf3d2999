// RemoteReader: the cluster's RemoteReads. A read of keys missing here
// asks each key's home (one batched Lookup per home node; the local
// directory when the home is this node; positive answers are reused for a
// short TTL), then fetches each found key from a
// live holder straight into a reserved local DRAM slot (the transport's
// sink) and pins it: committed as a replica (a kCopy write: the holdings
// stream publishes it) when RemoteReaderOptions::replicas says so, else
// pinned uncommitted for the read alone. The lookups, the choice of holders, the fetches
// and the cool-downs are RouteFetcher's (route_fetch.h); the slots and
// replicas are the reader's.
//
// Failure: a lookup or fetch that fails or misses its deadline is a miss;
// after Unavailable or DeadlineExceeded the peer is avoided for a cool-down.
// A fenced node does not go remote (everything misses).
//
// Thread-safe. Stages after a reply that may wait (a Reserve with an SSD
// tier, a retry) run on the executor, never on the transport thread.
// Stop() must be called, and must return, before the cluster's
// transport is destroyed.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/remote_source.h"
#include "common/clock.h"
#include "common/enum_names.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct RemoteReaderOptions {
  // Deadline of each directory lookup and each fetch. Shorter: a dead peer
  // costs less; longer: a slow network still hits.
  std::chrono::milliseconds lookup_timeout{500};
  std::chrono::milliseconds fetch_timeout{2000};
  // How long a peer that failed Unavailable/DeadlineExceeded is avoided.
  std::chrono::milliseconds cooldown{2000};
  // How long a positive lookup answer from a remote home is reused at most
  // (0: not cached; less after stale answers: RouteFetcherOptions). Longer
  // saves round trips (exists then get); a stale answer costs a failed
  // fetch, after which the entry is dropped.
  std::chrono::milliseconds lookup_cache_ttl{1000};
  // Entries cached at most (the cache is cleared when full).
  size_t lookup_cache_entries = 1u << 16;
  // Which values a read fetched are kept here as replicas (committed,
  // published; first in line to go under the prefix policy): every one (kAll); those this node had
  // fetched already within its last replica_window fetched values
  // (kRepeat: values read here again soon, such as a shared system prompt,
  // spread to their readers); or none (kNone). A value not kept is served
  // to the read that asked and dropped when released, so a copy read once
  // never takes the room of what this node holds alone.
  enum class Replicas { kAll, kRepeat, kNone };
  static constexpr EnumNames<Replicas, 3> kReplicasNames = {
      {{"all", Replicas::kAll}, {"repeat", Replicas::kRepeat}, {"none", Replicas::kNone}}};
  Replicas replicas = Replicas::kRepeat;
  // kRepeat: fetched values remembered (about 100 bytes each).
  size_t replica_window = 64;
  // Keys exists lookups found dropped lately, or fetches found gone from
  // the holder their lookup named (EvictedLately), kept at most (all are
  // forgotten when full).
  size_t evicted_lately_entries = 1u << 16;
  // Chain reads: a read (or exists, or hint) of kChainReadMinKeys keys or
  // more looks only its first key up at its home, then asks that key's
  // holder which of the others it holds (one kPeerHolderLookup), and looks
  // up at their homes only the keys the holder lacks. Where a chain lives
  // on one node (placement chain or local) a read so costs two lookup
  // messages at any cluster size, where per-key homes cost up to
  // min(N, keys); it waits two round trips before fetching, not one.
  bool chain_reads = false;
  static constexpr size_t kChainReadMinKeys = 4;
  // The tenant whose keys this reader reads (empty: the default tenant):
  // its store, directory and peer messages are that tenant's.
  std::string tenant;
};

class RemoteReader final : public RemoteReads {
 public:
  // All pointers must outlive the reader. clock: reads the peers'
  // cool-downs and the lookup cache's TTL.
  RemoteReader(const RemoteReaderOptions& options, Cluster* cluster, Directory* directory,
               TieredStore* store, Executor* executor, MetricsRegistry* metrics,
               const Clock* clock = SystemClock::Get());
  ~RemoteReader() override;

  void Fetch(std::vector<KeyId> keys, FetchDone done) override;
  void Exists(std::vector<KeyId> keys, ExistsDone done) override;
  bool EvictedLately(const KeyId& key) const override;
  void Hint(const HintSpec& spec, std::vector<KeyId> keys, HintDone done) override;
  void Prefetch(std::vector<KeyId> keys, PrefetchDone done) override;
  // Where key is as far as this node knows without asking: "" here, a
  // holder a lookup named (the lookup cache, or this node's own directory
  // when it is the home), nullopt not known.
  std::optional<std::string> HolderOf(const KeyId& key) const;

  // New reads miss at once; waits for running stages to leave the transport.
  void Stop();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kvpool::cluster
