#include "cluster/remote_reader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/gate.h"
#include "common/log.h"
#include "peer/peer_messages_format.h"
#include "peer/route_fetch.h"
#include "protocol/codec.h"

namespace kvpool::cluster {

using transport::SteadyClock;

struct RemoteReader::State {
  RemoteReaderOptions opts;
  Cluster* cluster = nullptr;
  Directory* directory = nullptr;
  TieredStore* store = nullptr;
  Executor* executor = nullptr;
  std::unique_ptr<RouteFetcher> fetcher;

  // Keys the homes' ghosts named in exists lookups, and keys a fetch found
  // gone from the holder a lookup named (EvictedLately).
  mutable std::mutex lately_mu;
  std::unordered_set<KeyId, KeyIdHash> evicted_lately;  // protected by lately_mu
  std::atomic<bool> any_evicted_lately{false};          // evicted_lately is not empty

  void NoteEvictedLately(const KeyId& key) {
    std::lock_guard lock(lately_mu);
    if (evicted_lately.size() >= opts.evicted_lately_entries) evicted_lately.clear();
    evicted_lately.insert(key);
    any_evicted_lately.store(true, std::memory_order_relaxed);
  }

  // Replicas::kRepeat: the last replica_window keys fetched, and how many
  // times each is among them.
  std::mutex fetched_mu;
  std::deque<KeyId> fetched_order;                               // protected by fetched_mu
  std::unordered_map<KeyId, uint32_t, KeyIdHash> fetched_count;  // protected by fetched_mu

  // Whether the value of key, just fetched, is kept as a replica.
  bool KeepReplica(const KeyId& key) {
    switch (opts.replicas) {
      case RemoteReaderOptions::Replicas::kAll:
        return true;
      case RemoteReaderOptions::Replicas::kNone:
        return false;
      case RemoteReaderOptions::Replicas::kRepeat:
        break;
    }
    std::lock_guard lock(fetched_mu);
    uint32_t& n = fetched_count[key];
    bool again = n > 0;
    ++n;
    fetched_order.push_back(key);
    while (fetched_order.size() > opts.replica_window) {
      auto it = fetched_count.find(fetched_order.front());
      if (--it->second == 0) fetched_count.erase(it);
      fetched_order.pop_front();
    }
    return again;
  }

  // Lookup answers are reused at most a sixteenth of how long a key stays
  // listed at this node's directory (its entries over the departures per
  // second, sampled every kChurnSample): a pool whose values stay put keeps
  // the whole TTL, one that churns reuses answers for less. (An answer
  // gone stale is seen by a fetch, which halves the TTL, but not by an
  // exists call: a writer told a block is cached does not write it.)
  static constexpr auto kChurnSample = std::chrono::milliseconds(250);
  static constexpr int kChurnDivisor = 16;
  const kvpool::Clock* clock = nullptr;
  std::mutex churn_mu;
  SteadyClock::time_point churn_at;  // protected by churn_mu
  uint64_t churn_departures = 0;  // protected by churn_mu
  void SampleChurn() {
    const SteadyClock::time_point now = clock->Now();
    std::unique_lock lock(churn_mu, std::try_to_lock);
    if (!lock.owns_lock() || now < churn_at + kChurnSample) return;
    const uint64_t departures = directory->departures();
    if (churn_at != SteadyClock::time_point{}) {
      const uint64_t gone = departures - churn_departures;
      const double secs = std::chrono::duration<double>(now - churn_at).count();
      const double stay_us = gone == 0 ? 0
                                       : static_cast<double>(directory->entries()) * secs * 1e6 /
                                             static_cast<double>(gone);
      fetcher->BoundReuse(
          gone == 0 ? std::chrono::microseconds::max()
                    : std::chrono::microseconds(static_cast<int64_t>(stay_us / kChurnDivisor)));
    }
    churn_at = now;
    churn_departures = departures;
  }

  Counter* fetch_bytes = nullptr;
  Counter* replicas_kept = nullptr;
  Counter* evicted_lately_found = nullptr;
  Counter* hits = nullptr;
  Counter* misses = nullptr;

  // Stages that may call the transport run inside it.
  Gate gate;

  // This node's own directory's answers, as it names holders to itself
  // (Directory::Lookup's asker: this node).
  std::vector<LookupResult> LocalLookup(std::span<const KeyId> keys) const {
    return directory->Lookup(keys, self_asker);
  }
  uint64_t self_asker = 0;  // Directory::AskerOf(this node's id)
  // A hash of this node's id: how it is named among askers and readers.
  uint64_t self_hash = 0;

  // Where keys live now, as this node sees it.
  Routes CurrentRoutes() const {
    return Routes{cluster->view(), cluster->shard_map(), cluster->node_id()};
  }

  bool Enter() { return gate.Enter(); }
  void Leave() { gate.Leave(); }

  // Runs fn on the executor (inside the gate), or skip() at once when
  // stopping.
  void Continue(std::shared_ptr<State> self, std::function<void()> fn, std::function<void()> skip) {
    if (gate.closed()) {
      skip();
      return;
    }
    executor->Submit([self, fn = std::move(fn), skip = std::move(skip)] {
      if (!self->gate.Run(fn)) skip();
    });
  }
};

namespace {

using ResolvedOn = RouteFetcher::ResolvedOn;

// Starts the lookups of every key of `batch` at their homes (this node's
// directory for keys homed here); see RouteFetcher::Lookup. With chain
// reads, the first key's home, then its holder (ChainLookup).
void ChainLookup(const std::shared_ptr<RemoteReader::State>& st,
                 const std::shared_ptr<LookupBatch>& batch, const Routes& routes,
                 transport::Deadline deadline, const RouteFetcher::Resolved& resolved);

void StartLookup(const std::shared_ptr<RemoteReader::State>& st,
                 const std::shared_ptr<LookupBatch>& batch, const Routes& routes,
                 RouteFetcher::Resolved resolved) {
  st->SampleChurn();
  const auto deadline = SteadyClock::now() + st->opts.lookup_timeout;
  if (st->opts.chain_reads && batch->keys.size() >= RemoteReaderOptions::kChainReadMinKeys) {
    return ChainLookup(st, batch, routes, deadline, resolved);
  }
  std::vector<size_t> all(batch->keys.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  st->fetcher->Lookup(
      routes, batch, all, deadline,
      [st](std::span<const KeyId> keys) { return st->LocalLookup(keys); }, std::move(resolved));
}

// The keys idx of batch looked up at their homes, each group handed on as
// resolved on `on` (a group the fetcher resolved at once counts as `on`:
// the thread this runs on, where that is a transport thread).
void LookupAtHomes(const std::shared_ptr<RemoteReader::State>& st,
                   const std::shared_ptr<LookupBatch>& batch, const Routes& routes,
                   const std::vector<size_t>& idx, transport::Deadline deadline, ResolvedOn on,
                   const RouteFetcher::Resolved& resolved) {
  st->fetcher->Lookup(
      routes, batch, idx, deadline,
      [st](std::span<const KeyId> keys) { return st->LocalLookup(keys); },
      [resolved, on](std::vector<size_t> part, const Status& s, ResolvedOn got) {
        resolved(std::move(part), s, got == ResolvedOn::kCaller ? on : got);
      });
}

void ChainLookup(const std::shared_ptr<RemoteReader::State>& st,
                 const std::shared_ptr<LookupBatch>& batch, const Routes& routes,
                 transport::Deadline deadline, const RouteFetcher::Resolved& resolved) {
  std::vector<size_t> rest(batch->keys.size() - 1);
  for (size_t i = 0; i < rest.size(); ++i) rest[i] = i + 1;
  // The first key, at its home (or this node's directory, or the cache).
  LookupAtHomes(st, batch, routes, {0}, deadline, ResolvedOn::kCaller,
                [st, batch, routes, deadline, resolved, rest = std::move(rest)](
                    std::vector<size_t> head, const Status& s, ResolvedOn on) {
                  std::vector<std::string> holders;
                  if (s.ok() && batch->results[0].size > 0) {
                    holders = st->fetcher->Candidates(routes, batch->results[0]);
                  }
                  resolved(std::move(head), s, on);
                  if (holders.empty()) {
                    // Nobody holds the first key: the rest at their homes.
                    return LookupAtHomes(st, batch, routes, rest, deadline, on, resolved);
                  }
                  // Its holder says which of the rest it holds; the others are
                  // looked up at their homes. With several holders (replicas of a hot
                  // prefix), each reader asks its own pick, so the readers of one
                  // chain spread over its copies.
                  const std::string& holder = holders[st->self_hash % holders.size()];
                  st->fetcher->AskHolder(
                      routes, batch, rest, holder, deadline,
                      [st, batch, routes, deadline, resolved, on](
                          std::vector<size_t> part, const Status& hs, ResolvedOn got) {
                        // Answered from the cache: on this thread.
                        const ResolvedOn on2 = got == ResolvedOn::kCaller ? on : got;
                        std::vector<size_t> found, lacking;
                        for (size_t i : part) {
                          (hs.ok() && batch->results[i].size > 0 ? found : lacking).push_back(i);
                        }
                        if (!lacking.empty()) {
                          LookupAtHomes(st, batch, routes, lacking, deadline, on2, resolved);
                        }
                        if (!found.empty()) resolved(std::move(found), Status::Ok(), on2);
                      });
                });
}

// An exists: counts the keys resolved and answers once all are.
struct ExistsOp : LookupBatch {
  using LookupBatch::LookupBatch;
  std::atomic<size_t> pending{0};
  RemoteReads::ExistsDone done;
};

// A batch resolved by several homes, acted on once all have answered.
struct ResolvingBatch : LookupBatch {
  using LookupBatch::LookupBatch;
  // The keys the homes resolved so far.
  std::mutex resolved_mu;
  std::vector<size_t> resolved;  // protected by resolved_mu

  // Adds the keys one home resolved; true with every key of the batch in
  // *all (ascending) once the last home has answered.
  bool AllResolved(const std::vector<size_t>& idx, std::vector<size_t>* all) {
    std::lock_guard lock(resolved_mu);
    resolved.insert(resolved.end(), idx.begin(), idx.end());
    if (resolved.size() < keys.size()) return false;
    std::sort(resolved.begin(), resolved.end());
    all->swap(resolved);
    return true;
  }
};

// A fetch: once every key's home has answered, each key is fetched from
// its live holders in turn into a reserved local DRAM slot. A prefetch
// (prefetch_done set) commits each as a write and answers with the keys.
struct FetchOp : ResolvingBatch {
  using ResolvingBatch::ResolvingBatch;
  std::vector<TieredStore::Reservation> slots;
  std::mutex mu;
  std::vector<TieredStore::Pin> pins;  // protected by mu
  std::vector<KeyId> here;             // a prefetch's committed keys; protected by mu
  // Keys not finished yet, plus one held until the lookups are all out, so
  // `done` never runs inside Fetch().
  std::atomic<size_t> pending{0};
  RemoteReads::FetchDone done;
  RemoteReads::PrefetchDone prefetch_done;

  void AddPin(TieredStore::Pin pin) {
    std::lock_guard lock(mu);
    pins.push_back(std::move(pin));
  }
  void AddHere(const KeyId& key) {
    std::lock_guard lock(mu);
    here.push_back(key);
  }
  void Finished(size_t n) {
    if (n == 0 || pending.fetch_sub(n, std::memory_order_acq_rel) != n) return;
    std::vector<TieredStore::Pin> out;
    std::vector<KeyId> keys_here;
    {
      std::lock_guard lock(mu);
      out.swap(pins);
      keys_here.swap(here);
    }
    slots.clear();
    if (!prefetch_done) return done(std::move(out));
    for (const TieredStore::Pin& p : out) keys_here.push_back(p.key());
    out.clear();
    prefetch_done(std::move(keys_here));
  }
};

// Fetches key i of op from its holders into its reserved slot, and commits
// and pins it; a key no holder served is a miss.
void IssueFetch(const std::shared_ptr<RemoteReader::State>& st, const std::shared_ptr<FetchOp>& op,
                size_t i, std::vector<std::string> peers) {
  FetchRequest req;
  req.key = op->keys[i];
  req.peers = std::move(peers);
  req.sink = op->slots[i].bytes();
  req.expected_size = op->slots[i].size();
  req.per_attempt = st->opts.fetch_timeout;
  // The next holder is asked from the executor (a failed attempt ends on a
  // transport thread).
  auto retry = [st](std::function<void(bool)> step) {
    st->Continue(st, [step] { step(true); }, [step] { step(false); });
  };
  st->fetcher->Fetch(std::move(req), retry, [st, op, i](const Status& s, uint64_t got) {
    if (s.ok() && op->prefetch_done) {
      // Kept, placed as a write: a prefetch names what comes back.
      Status c = st->store->Commit(std::move(op->slots[i]), WriteOrigin::kCopy);
      if (c.ok() || c.code() == StatusCode::kAlreadyExists) {
        st->hits->Inc();
        st->fetch_bytes->Inc(got);
        if (c.ok()) st->replicas_kept->Inc();
        op->AddHere(op->keys[i]);
      } else {
        st->misses->Inc();
      }
      op->Finished(1);
      return;
    }
    if (s.ok()) {
      bool keep = st->KeepReplica(op->keys[i]);
      const uint64_t slot = op->slots[i].offset();
      auto pin = keep ? st->store->CommitAndAcquire(std::move(op->slots[i]), WriteOrigin::kCopy)
                      : st->store->PinUncommitted(std::move(op->slots[i]));
      if (pin.ok()) {
        st->hits->Inc();
        // Not when another writer committed the key first (its entry, in
        // another slot, is what the pin holds).
        if (keep && pin->offset() == slot) st->replicas_kept->Inc();
        st->fetch_bytes->Inc(got);
        op->AddPin(std::move(pin).value());
      } else {
        st->misses->Inc();
      }
      op->Finished(1);
      return;
    }
    op->slots[i].Reset();
    st->misses->Inc();
    // Its holder no longer has it: dropped since the lookup named it, so a
    // write of it now is a block coming back.
    if (s.code() == StatusCode::kNotFound) st->NoteEvictedLately(op->keys[i]);
    op->Finished(1);
  });
}

// Reserves slots for the resolved keys idx of op and fetches them. Runs
// inside the gate; on a transport thread only without an SSD tier (with one,
// Reserve may wait for room on SSD).
void StartFetches(const std::shared_ptr<RemoteReader::State>& st,
                  const std::shared_ptr<FetchOp>& op, const std::vector<size_t>& idx) {
  Routes routes = st->CurrentRoutes();
  size_t misses = 0, finished = 0;
  std::vector<std::pair<size_t, std::vector<std::string>>> to_fetch;
  for (size_t i : idx) {
    const KeyId& key = op->keys[i];
    const LookupResult& r = op->results[i];
    std::vector<std::string> peers;
    if (r.size > 0) peers = st->fetcher->Candidates(routes, r);
    if (peers.empty()) {
      ++misses;
      continue;
    }
    auto slot = st->store->ReserveForRead(key, r.size);
    if (!slot.ok()) {
      // Stored here meanwhile (by a writer or another fetch): serve that.
      auto pin = slot.status().code() == StatusCode::kAlreadyExists
                     ? st->store->Acquire(key)
                     : Result<TieredStore::Pin>(slot.status());
      if (pin.ok()) {
        op->AddPin(std::move(pin).value());
        ++finished;
      } else {
        ++misses;
      }
      continue;
    }
    op->slots[i] = std::move(slot).value();
    to_fetch.emplace_back(i, std::move(peers));
  }
  // In the order the eviction policy reads a chain (last to first for one
  // that keeps a chain's head longest): a holder touches each value it
  // serves, and a batch is a chain in order, as in a local read
  // (TieredStore::ReadBatch). idx is the whole
  // batch, whichever homes resolved its keys: a chain's keys have different
  // homes, and fetching each home's share as it answered would touch a
  // holder's blocks of the chain in the order the answers came.
  st->store->InChainReadOrder(to_fetch.size(), [&](size_t k) {
    IssueFetch(st, op, to_fetch[k].first, std::move(to_fetch[k].second));
  });
  st->misses->Inc(misses);
  op->Finished(misses + finished);
}

void StartFetchOp(const std::shared_ptr<RemoteReader::State>& st,
                  const std::shared_ptr<FetchOp>& op);

// A fetch (done in FetchOp::done) or a prefetch (FetchOp::prefetch_done):
// nothing when there is nothing to do or the reader cannot ask now.
template <typename Done>
void BeginFetch(const std::shared_ptr<RemoteReader::State>& st, std::vector<KeyId> keys, Done done,
                Done FetchOp::*slot) {
  if (keys.empty() || st->cluster->fenced() || !st->Enter()) {
    if (!keys.empty()) st->misses->Inc(keys.size());
    done({});
    return;
  }
  auto op = std::make_shared<FetchOp>(std::move(keys));
  (*op).*slot = std::move(done);
  StartFetchOp(st, op);
}

}  // namespace

RemoteReader::RemoteReader(const RemoteReaderOptions& options, Cluster* cluster,
                           Directory* directory, TieredStore* store, Executor* executor,
                           MetricsRegistry* m, const kvpool::Clock* clock)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.opts = options;
  s.cluster = cluster;
  s.directory = directory;
  s.store = store;
  s.executor = executor;
  RouteFetcherOptions fo;
  fo.cooldown = options.cooldown;
  fo.lookup_cache_ttl = options.lookup_cache_ttl;
  fo.lookup_cache_entries = options.lookup_cache_entries;
  fo.tenant = options.tenant;
  s.fetcher = std::make_unique<RouteFetcher>(fo, cluster->transport(), m, clock);
  s.clock = clock != nullptr ? clock : SystemClock::Get();
  s.self_hash = std::hash<std::string>{}(cluster->node_id());
  s.self_asker = Directory::AskerOf(cluster->node_id());
  s.evicted_lately_found =
      m->GetCounter("kvpool_remote_evicted_lately_total",
                    "Exists items no node holds that their home saw dropped lately (written "
                    "again, they are kept as returning blocks)");
  s.fetch_bytes = m->GetCounter("kvpool_remote_fetch_bytes_total", "Value bytes fetched from peers");
  s.replicas_kept =
      m->GetCounter("kvpool_remote_replicas_kept_total",
                    "Values fetched from peers kept here as replicas (--read-replicas); the rest "
                    "of kvpool_remote_hits_total were dropped after their read");
  s.hits = m->GetCounter("kvpool_remote_hits_total", "Local misses served from a peer");
  s.misses = m->GetCounter("kvpool_remote_misses_total", "Local misses no peer could serve");
}

RemoteReader::~RemoteReader() { Stop(); }

void RemoteReader::Stop() { state_->gate.Close(); }

void RemoteReader::Fetch(std::vector<KeyId> keys, FetchDone done) {
  BeginFetch(state_, std::move(keys), std::move(done), &FetchOp::done);
}

void RemoteReader::Prefetch(std::vector<KeyId> keys, PrefetchDone done) {
  BeginFetch(state_, std::move(keys), std::move(done), &FetchOp::prefetch_done);
}

namespace {

// Looks a fetch's keys up and fetches them (Fetch, Prefetch). Called inside
// the gate, which it leaves.
void StartFetchOp(const std::shared_ptr<RemoteReader::State>& st,
                  const std::shared_ptr<FetchOp>& op) {
  op->slots.resize(op->keys.size());
  op->pending.store(op->keys.size() + 1, std::memory_order_relaxed);
  StartLookup(st, op, st->CurrentRoutes(),
              [st, op](std::vector<size_t> part, const Status&, ResolvedOn on) {
                // Fetched once every home has answered, the whole chain last to first.
                std::vector<size_t> idx;
                if (!op->AllResolved(part, &idx)) return;
                if (on == ResolvedOn::kCaller) return StartFetches(st, op, idx);  // inside the gate
                if (!st->store->has_ssd_tier() && st->Enter()) {
                  // Without an SSD tier a Reserve never waits: start on this transport
                  // thread and save a hand-off per read.
                  StartFetches(st, op, idx);
                  st->Leave();
                  return;
                }
                st->Continue(
                    st, [st, op, idx] { StartFetches(st, op, idx); },
                    [st, op, n = idx.size()] {
                      st->misses->Inc(n);
                      op->Finished(n);
                    });
              });
  // The extra count is dropped from the executor, so done never runs here.
  st->Continue(st, [op] { op->Finished(1); }, [op] { op->Finished(1); });
  st->Leave();
}

// A hint for keys held elsewhere: once every home has answered, one peer
// hint per holder.
struct HintBatch : ResolvingBatch {
  using ResolvingBatch::ResolvingBatch;
  RemoteReads::HintSpec spec;
  RemoteReads::HintDone done;
  std::mutex mu;
  HintResult sum;      // protected by mu
  Status refused;      // a holder's refusal; protected by mu
  size_t pending = 0;  // calls out, plus one while they are sent; protected by mu

  // One call (or the sending) ended: the answer once none is out.
  void Ended(size_t unknown, const HintResult* got, const Status& refusal) {
    bool last = false;
    {
      std::lock_guard lock(mu);
      sum.unknown += unknown;
      if (got != nullptr) {
        sum.applied += got->applied;
        sum.unknown += got->unknown;
        sum.clipped += got->clipped;
        sum.moved += got->moved;
      }
      if (!refusal.ok() && refused.ok()) refused = refusal;
      last = --pending == 0;
    }
    if (!last) return;
    if (!refused.ok()) return done(refused);
    done(sum);
  }
};

// Sends each holder its keys of the hint (on the executor, inside the gate).
void SendHints(const std::shared_ptr<RemoteReader::State>& st,
               const std::shared_ptr<HintBatch>& op) {
  Routes routes = st->CurrentRoutes();
  std::map<std::string, std::vector<KeyId>> by_holder;
  size_t unknown = 0;
  for (size_t i = 0; i < op->keys.size(); ++i) {
    std::vector<std::string> peers;
    if (op->results[i].size > 0) peers = st->fetcher->Candidates(routes, op->results[i]);
    if (peers.empty()) {
      ++unknown;
    } else {
      by_holder[peers.front()].push_back(op->keys[i]);
    }
  }
  {
    std::lock_guard lock(op->mu);
    op->pending += by_holder.size();
  }
  std::vector<uint8_t> header;
  EncodeTenantScope(st->opts.tenant, {}, &header);
  for (auto& [peer, keys] : by_holder) {
    protocol::HintRequest m;
    m.op = static_cast<uint32_t>(op->spec.op);
    m.priority = op->spec.priority;
    m.ttl_ms = op->spec.ttl_ms;
    m.keys = std::move(keys);
    auto payload = std::make_shared<std::vector<uint8_t>>();
    protocol::EncodeHint(m, payload.get());
    const size_t n = m.keys.size();
    transport::CallArgs args;
    args.peer = peer;
    args.type = ScopedType(kPeerHint, st->opts.tenant);
    args.request = header;
    args.payload = *payload;
    args.deadline = SteadyClock::now() + st->opts.fetch_timeout;
    st->cluster->transport()->Call(args, [op, payload, n, peer](transport::Reply rep) {
      protocol::HintReply r;
      Status s = rep.status;
      if (s.ok()) s = protocol::DecodeHintReply(rep.header, &r);
      if (s.ok()) {
        const HintResult got{r.applied, r.unknown, r.clipped, r.moved};
        return op->Ended(0, &got, Status::Ok());
      }
      LogDebug("hint of {} keys to {}: {}", n, peer, s.ToString());
      // A refusal is the answer; an unreachable holder leaves its keys unknown.
      const bool refusal =
          s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kResourceExhausted;
      op->Ended(n, nullptr, refusal ? s : Status::Ok());
    });
  }
  op->Ended(unknown, nullptr, Status::Ok());
}

}  // namespace

void RemoteReader::Hint(const HintSpec& spec, std::vector<KeyId> keys, HintDone done) {
  auto st = state_;
  if (keys.empty() || st->cluster->fenced() || !st->Enter()) {
    HintResult r;
    r.unknown = keys.size();
    done(r);
    return;
  }
  auto op = std::make_shared<HintBatch>(std::move(keys));
  op->spec = spec;
  op->done = std::move(done);
  op->pending = 1;
  StartLookup(st, op, st->CurrentRoutes(),
              [st, op](std::vector<size_t> part, const Status&, ResolvedOn) {
                std::vector<size_t> idx;
                if (!op->AllResolved(part, &idx)) return;
                st->Continue(
                    st, [st, op] { SendHints(st, op); },
                    [op] { op->Ended(op->keys.size(), nullptr, Status::Ok()); });
              });
  st->Leave();
}

std::optional<std::string> RemoteReader::HolderOf(const KeyId& key) const {
  State& st = *state_;
  if (st.store->Contains(key)) return std::string();
  Routes routes = st.CurrentRoutes();
  auto peers = st.fetcher->CachedCandidates(routes, key);
  if (peers.empty()) {
    auto local = st.directory->Lookup(std::span<const KeyId>(&key, 1));
    if (!local.empty()) peers = st.fetcher->Candidates(routes, local[0]);
  }
  if (peers.empty()) return std::nullopt;
  return peers.front();
}

bool RemoteReader::EvictedLately(const KeyId& key) const {
  if (!state_->any_evicted_lately.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(state_->lately_mu);
  return state_->evicted_lately.count(key) > 0;
}

void RemoteReader::Exists(std::vector<KeyId> keys, ExistsDone done) {
  auto st = state_;
  if (keys.empty() || st->cluster->fenced() || !st->Enter()) {
    done({});
    return;
  }
  auto op = std::make_shared<ExistsOp>(std::move(keys));
  op->done = std::move(done);
  op->pending.store(op->keys.size(), std::memory_order_relaxed);
  auto answer = [st, op] {
    Routes routes = st->CurrentRoutes();
    std::vector<KeyId> hits;
    for (size_t i = 0; i < op->keys.size(); ++i) {
      if (op->results[i].size > 0 && !st->fetcher->Candidates(routes, op->results[i]).empty()) {
        hits.push_back(op->keys[i]);
      } else if (op->results[i].evicted_lately) {
        st->evicted_lately_found->Inc();
        st->NoteEvictedLately(op->keys[i]);
      }
    }
    op->done(std::move(hits));
  };
  StartLookup(st, op, st->CurrentRoutes(), [st, op, answer](std::vector<size_t> idx, const Status&,
                                                            ResolvedOn on) {
    size_t n = idx.size();
    if (op->pending.fetch_sub(n, std::memory_order_acq_rel) != n) return;
    // Everything resolved; never answer inside Exists() itself.
    if (on == ResolvedOn::kCaller) {
      st->Continue(st, answer, answer);
    } else {
      answer();
    }
  });
  st->Leave();
}

}  // namespace kvpool::cluster
