// RouteFetcher: reads values held by other nodes, over the peer protocol
// (peer/peer_messages_format.h). It looks keys up at their homes (one
// batched Lookup per home; this node's own directory through a callback
// when the home is the asker; positive answers reused for a short TTL),
// picks the live holders, and fetches a value from them in turn, straight
// into a sink the caller names, each call bounded by a deadline. A peer that
// failed Unavailable or DeadlineExceeded is avoided for a cool-down.
//
// It knows the transport, the membership view and shard map it is handed,
// and the message formats; not the store. Its users: the node's
// RemoteReader (which fetches into local slots, kept as replicas when
// --read-replicas says so) and
// libkvpool's remote mode (RemoteClient, which fetches into the caller's
// buffers).
//
// Thread-safe. Callbacks run on a transport thread, or on the caller's
// thread where the docs say so, never with a lock of this class held.
// Ownership: the transport, the registry and the clock must outlive every
// callback of the calls the fetcher started; the fetcher itself need not.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/key_id.h"
#include "common/metrics.h"
#include "common/status.h"
#include "membership/membership.h"
#include "membership/shard_map.h"
#include "peer/peer_messages_format.h"
#include "transport/transport.h"

namespace kvpool::cluster {

struct RouteFetcherOptions {
  // How long a peer that failed Unavailable/DeadlineExceeded is avoided
  // (0: never). Longer spares calls to a dead peer; shorter finds a
  // recovered one sooner.
  // A member that a later view lists under a new incarnation (restarted, or
  // joined after its old lease) is not avoided for what its old life did.
  std::chrono::milliseconds cooldown{2000};
  // How long a positive lookup answer from a remote home is reused (0: not
  // cached). Longer saves round trips (exists then get); a stale answer
  // costs a failed fetch, after which the entry is dropped.
  std::chrono::milliseconds lookup_cache_ttl{1000};
  // Entries cached at most (the cache is cleared when full).
  size_t lookup_cache_entries = 1u << 16;
  // The reuse time adapts: each time a fetch finds that every holder a
  // cached answer named has dropped the value since, it halves (down to
  // lookup_cache_ttl / kTtlFloorDivisor); each fetch served grows it by
  // 1/kTtlGrowthDivisor, up to lookup_cache_ttl. It so settles where about
  // one fetch in 2,800 meets a stale answer: when a pool churns faster than
  // lookup_cache_ttl, answers are reused for less, and a pool whose values
  // stay put keeps the whole TTL.
  // The tenant whose keys are read (empty: the default tenant): its
  // lookups and fetches go as kPeerTenantLookup and kPeerTenantFetch.
  // Members only (a client's tenant comes from its token).
  std::string tenant;
  static constexpr int kTtlFloorDivisor = 1024;
  static constexpr int kTtlGrowthDivisor = 4096;
};

// Where keys live, as of one membership view.
struct Routes {
  std::shared_ptr<const MembershipView> view;  // never null
  std::shared_ptr<const ShardMap> map;         // computed from view; never null
  std::string self;  // the asking node's id; empty for a client (not a member)
};

// The keys of one read and what their homes answered: results[i] is
// written once, before index i is handed to the Resolved callback.
struct LookupBatch {
  explicit LookupBatch(std::vector<KeyId> k) : keys(std::move(k)), results(keys.size()) {}
  std::vector<KeyId> keys;
  std::vector<LookupResult> results;
};

// One value to fetch from the first holder in `peers` that serves it.
struct FetchRequest {
  KeyId key;
  std::vector<std::string> peers;  // candidate holders' addresses, in order
  std::span<uint8_t> sink;         // the value lands here; valid until done
  // The value's size when known (the directory's); any other size from a
  // holder is a failure and the next holder is tried. 0: unknown, any size
  // up to sink.size(), and a value too large for the sink
  // (ResourceExhausted) ends the walk, as every holder has the same value.
  uint64_t expected_size = 0;
  // Each attempt's deadline: now + per_attempt (0: no own limit), and
  // never past `deadline`. Once `deadline` has passed no (further) holder
  // is tried and the walk ends NotFound.
  std::chrono::milliseconds per_attempt{0};
  transport::Deadline deadline = transport::Deadline::max();
};

class RouteFetcher {
 public:
  // Where a group of resolved keys is handed on from.
  enum class ResolvedOn { kCaller, kTransportThread };
  // Hands on a group of key indexes. status: Ok when their results are
  // answers (from the home, this node's directory or the cache); else why
  // not (no home, home cooling down, lookup failed), results left empty.
  using Resolved =
      std::function<void(std::vector<size_t> idx, const Status& status, ResolvedOn on)>;
  // Answers lookups of keys homed at `Routes::self` (this node's directory).
  using LocalLookup = std::function<std::vector<LookupResult>(std::span<const KeyId> keys)>;
  // Runs `step` for the next holder of a walk: step(true) goes on,
  // step(false) gives up (the walk ends Aborted). Null: the next attempt
  // starts at once on the transport thread.
  using Retry = std::function<void(std::function<void(bool go)> step)>;
  // status Ok: the value's `size` bytes are in the sink.
  using FetchDone = std::function<void(const Status& status, uint64_t size)>;

  // metrics null: counted in a registry of the fetcher's own (a client
  // without an exporter). clock: reads the cool-downs and the cache TTL.
  RouteFetcher(const RouteFetcherOptions& options, transport::Transport* transport,
               MetricsRegistry* metrics, const Clock* clock = SystemClock::Get());
  ~RouteFetcher();
  RouteFetcher(const RouteFetcher&) = delete;
  RouteFetcher& operator=(const RouteFetcher&) = delete;

  // Looks batch->keys[i], i in idx, up at their homes (lookups bounded by
  // deadline) and hands every index to `resolved` exactly once, in groups,
  // as soon as its result is in batch->results: keys answered by `local`
  // (REQUIRED when routes.self is set) or the cache, and those with no live
  // home, at once on the caller's thread after the remote lookups went
  // out; each remote home's keys on a transport thread when it answers or
  // fails. (RemoteReader's reads wait for every group before fetching, so
  // a chain is fetched in one order; exists calls count the groups.)
  void Lookup(const Routes& routes, const std::shared_ptr<LookupBatch>& batch,
              const std::vector<size_t>& idx, transport::Deadline deadline,
              const LocalLookup& local, Resolved resolved);

  // Asks the node at `address`, a holder rather than a home, which of
  // batch->keys[i], i in idx, it holds itself (kPeerHolderLookup, one call
  // per kMaxPeerBatch keys, each bounded by deadline), and hands each part
  // to `resolved` on a transport thread: Ok with the holder's answers in
  // batch->results (size 0: not held there), or why the call failed. Keys
  // the lookup cache answers are not asked about: they are handed on at
  // once, on the caller's thread, after the calls went out.
  void AskHolder(const Routes& routes, const std::shared_ptr<LookupBatch>& batch,
                 const std::vector<size_t>& idx, const std::string& address,
                 transport::Deadline deadline, Resolved resolved);

  // The live holders in r as peer addresses, in the home's order: not
  // routes.self, in the view under the same incarnation (0 in the view:
  // any), not cooling down; each once.
  std::vector<std::string> Candidates(const Routes& routes, const LookupResult& r);
  // Candidates of key's cached lookup answer; empty when none is cached.
  std::vector<std::string> CachedCandidates(const Routes& routes, const KeyId& key);
  // Answers are reused at most this long, whatever the TTL has grown to
  // (RemoteReader: a fraction of how long keys stay listed at this node's
  // directory); max(): no bound.
  void BoundReuse(std::chrono::microseconds bound);

  // Fetches request.key from its peers in turn until one serves it; `done`
  // runs once, on a transport thread (or on the thread `retry` runs steps
  // on): Ok, or the last attempt's failure. After every holder failed, the
  // key's cached lookup answer is dropped.
  void Fetch(FetchRequest request, Retry retry, FetchDone done);

  // Whether a peer is cooling down.
  bool Cooling(const std::string& address);

 private:
  struct State;
  struct Walk;
  // Static: the transport's callbacks hold the walk (and through it the
  // state), never the RouteFetcher itself.
  static void Attempt(const std::shared_ptr<Walk>& walk);
  static void Next(const std::shared_ptr<Walk>& walk);
  // Sends batch->keys[i], i in idx, to address as `base` lookups (scoped
  // by the tenant), at most kMaxPeerBatch keys a call.
  static void SendLookups(const std::shared_ptr<State>& st,
                          const std::shared_ptr<LookupBatch>& batch, const std::vector<size_t>& idx,
                          const std::string& address, transport::MessageType base,
                          transport::Deadline deadline, const Resolved& resolved);
  std::shared_ptr<State> state_;
};

}  // namespace kvpool::cluster
