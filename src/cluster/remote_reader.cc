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
#include "peer/peer_messages_format.h"
#include "peer/route_fetch.h"

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
// directory for keys homed here); see RouteFetcher::Lookup.
void StartLookup(const std::shared_ptr<RemoteReader::State>& st,
                 const std::shared_ptr<LookupBatch>& batch, const Routes& routes,
                 RouteFetcher::Resolved resolved) {
  st->SampleChurn();
  std::vector<size_t> all(batch->keys.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  st->fetcher->Lookup(
      routes, batch, all, SteadyClock::now() + st->opts.lookup_timeout,
      [st](std::span<const KeyId> keys) { return st->directory->Lookup(keys); },
      std::move(resolved));
}

// An exists: counts the keys resolved and answers once all are.
struct ExistsOp : LookupBatch {
  using LookupBatch::LookupBatch;
  std::atomic<size_t> pending{0};
  RemoteReads::ExistsDone done;
};

// A fetch: once every key's home has answered, each key is fetched from
// its live holders in turn into a reserved local DRAM slot.
struct FetchOp : LookupBatch {
  using LookupBatch::LookupBatch;
  std::vector<TieredStore::Reservation> slots;
  std::mutex mu;
  std::vector<TieredStore::Pin> pins;  // protected by mu
  // Keys not finished yet, plus one held until the lookups are all out, so
  // `done` never runs inside Fetch().
  std::atomic<size_t> pending{0};
  RemoteReads::FetchDone done;
  // The keys the homes resolved so far; fetched once all have answered.
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

  void AddPin(TieredStore::Pin pin) {
    std::lock_guard lock(mu);
    pins.push_back(std::move(pin));
  }
  void Finished(size_t n) {
    if (n == 0 || pending.fetch_sub(n, std::memory_order_acq_rel) != n) return;
    std::vector<TieredStore::Pin> out;
    {
      std::lock_guard lock(mu);
      out.swap(pins);
    }
    slots.clear();
    done(std::move(out));
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
  auto st = state_;
  if (keys.empty() || st->cluster->fenced() || !st->Enter()) {
    if (!keys.empty()) st->misses->Inc(keys.size());
    done({});
    return;
  }
  auto op = std::make_shared<FetchOp>(std::move(keys));
  op->slots.resize(op->keys.size());
  op->done = std::move(done);
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
