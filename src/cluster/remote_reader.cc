#include "cluster/remote_reader.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <unordered_map>

#include "cluster/peer_messages_format.h"
#include "common/log.h"

namespace kvpool::cluster {

using transport::Clock;

struct RemoteReader::State {
  RemoteReaderOptions opts;
  Cluster* cluster = nullptr;
  Directory* directory = nullptr;
  TieredStore* store = nullptr;
  Executor* executor = nullptr;

  Counter* lookups = nullptr;
  Counter* fetches = nullptr;
  Counter* fetch_bytes = nullptr;
  Counter* hits = nullptr;
  Counter* misses = nullptr;
  Counter* lookup_errors = nullptr;
  Counter* fetch_errors = nullptr;
  Counter* cooldowns = nullptr;
  Counter* cache_hits = nullptr;

  std::mutex mu;
  // Protected by mu: peers avoided until the time point; the stage gate.
  std::unordered_map<std::string, Clock::time_point> cooling;
  // Positive lookup answers from remote homes, until their expiry: an
  // exists followed by a get asks the home once.
  struct Cached {
    LookupResult result;
    Clock::time_point expiry;
  };
  std::unordered_map<KeyId, Cached, KeyIdHash> cache;
  bool stopping = false;
  int active = 0;
  std::condition_variable idle;

  // A cached answer counts only with holders the current view still has
  // under the same incarnation (0 in the view: not known yet, any): a holder
  // that restarted or re-registered dropped what it held.
  bool CacheGet(const KeyId& key, const MembershipView& view, LookupResult* out) {
    if (opts.lookup_cache_ttl.count() == 0) return false;
    std::lock_guard lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) return false;
    std::erase_if(it->second.result.holders, [&](const HolderRef& h) {
      const Member* m = view.Find(h.node_id);
      return m == nullptr || (m->incarnation != 0 && m->incarnation != h.incarnation);
    });
    if (Clock::now() >= it->second.expiry || it->second.result.holders.empty()) {
      cache.erase(it);
      return false;
    }
    *out = it->second.result;
    return true;
  }
  void CachePut(const KeyId& key, const LookupResult& r) {
    if (opts.lookup_cache_ttl.count() == 0 || r.holders.empty()) return;
    std::lock_guard lock(mu);
    if (cache.size() >= opts.lookup_cache_entries) cache.clear();  // crude but bounded
    cache[key] = {r, Clock::now() + opts.lookup_cache_ttl};
  }
  void CacheDrop(const KeyId& key) {
    std::lock_guard lock(mu);
    cache.erase(key);
  }

  bool Cooling(const std::string& address) {
    std::lock_guard lock(mu);
    auto it = cooling.find(address);
    if (it == cooling.end()) return false;
    if (Clock::now() >= it->second) {
      cooling.erase(it);
      return false;
    }
    return true;
  }

  void NoteFailure(const std::string& address, const Status& s) {
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded) return;
    std::lock_guard lock(mu);
    cooling[address] = Clock::now() + opts.cooldown;
    cooldowns->Inc();
  }

  // The gate: stages that may call the transport run inside it.
  bool Enter() {
    std::lock_guard lock(mu);
    if (stopping) return false;
    ++active;
    return true;
  }
  void Leave() {
    std::lock_guard lock(mu);
    if (--active == 0) idle.notify_all();
  }

  // Runs fn on the executor (inside the gate), or skip() at once when
  // shutting down.
  void Continue(std::shared_ptr<State> self, std::function<void()> fn, std::function<void()> skip) {
    {
      std::lock_guard lock(mu);
      if (stopping) {
        skip();
        return;
      }
    }
    executor->Submit([self, fn = std::move(fn), skip = std::move(skip)] {
      if (!self->Enter()) {
        skip();
        return;
      }
      fn();
      self->Leave();
    });
  }
};

namespace {

// The keys of one read and what their homes answered. Each key's result is
// written once, before the key's group is handed on (see StartLookup).
struct LookupState {
  std::vector<KeyId> keys;
  std::vector<LookupResult> results;
};

// Where a group of resolved keys is handed on from.
enum class ResolvedOn { kCaller, kTransportThread };
using Resolved = std::function<void(std::vector<size_t> idx, ResolvedOn on)>;

// The live holders of a key (not this node, in the view with the same
// incarnation, not cooling down), as peer addresses.
std::vector<std::string> Candidates(RemoteReader::State& st, const MembershipView& view,
                                    const LookupResult& r) {
  std::vector<std::string> out;
  for (const auto& h : r.holders) {
    if (h.node_id == st.cluster->node_id()) continue;
    const Member* m = view.Find(h.node_id);
    if (m == nullptr || (m->incarnation != 0 && m->incarnation != h.incarnation)) continue;
    if (st.Cooling(m->address)) continue;
    out.push_back(m->address);
  }
  return out;
}

// Looks the keys of op up at their homes and hands every key index to
// `resolved` exactly once, in groups, as soon as its result is in
// op->results: the keys answered by this node's directory or the cache (and
// those with no live home, left empty) at once on the caller's thread, each
// remote home's keys on a transport thread when that home answers or fails
// (a failed home's results stay empty). So a read can start fetching some
// keys while the lookups of others are still out.
void StartLookup(const std::shared_ptr<RemoteReader::State>& st,
                 const std::shared_ptr<LookupState>& op, const Resolved& resolved) {
  op->results.assign(op->keys.size(), {});
  st->lookups->Inc(op->keys.size());
  auto map = st->cluster->shard_map();
  auto view = st->cluster->view();
  std::map<std::string, std::vector<size_t>> groups;  // home address -> key indexes
  std::vector<KeyId> local_keys;
  std::vector<size_t> local_idx, now;
  for (size_t i = 0; i < op->keys.size(); ++i) {
    const Member* home = map->HomeOf(op->keys[i]);
    if (home == nullptr) {
      now.push_back(i);
    } else if (home->node_id == st->cluster->node_id()) {
      local_keys.push_back(op->keys[i]);
      local_idx.push_back(i);
    } else if (st->CacheGet(op->keys[i], *view, &op->results[i])) {
      st->cache_hits->Inc();
      now.push_back(i);
    } else if (!st->Cooling(home->address)) {
      groups[home->address].push_back(i);
    } else {
      now.push_back(i);
    }
  }
  if (!local_keys.empty()) {
    auto res = st->directory->Lookup(local_keys);
    for (size_t j = 0; j < res.size(); ++j) op->results[local_idx[j]] = std::move(res[j]);
    now.insert(now.end(), local_idx.begin(), local_idx.end());
  }
  // The remote lookups go out first: their round trips overlap the fetches
  // of the keys resolved here.
  for (auto& [address, idx] : groups) {
    for (size_t start = 0; start < idx.size(); start += kMaxPeerBatch) {
      size_t end = std::min(idx.size(), start + kMaxPeerBatch);
      std::vector<size_t> part(idx.begin() + static_cast<ptrdiff_t>(start),
                               idx.begin() + static_cast<ptrdiff_t>(end));
      std::vector<KeyId> keys;
      for (size_t i : part) keys.push_back(op->keys[i]);
      auto payload = std::make_shared<std::vector<uint8_t>>();
      EncodeLookup(keys, payload.get());
      transport::CallArgs args;
      args.peer = address;
      args.type = kPeerLookup;
      args.payload = *payload;
      args.deadline = Clock::now() + st->opts.lookup_timeout;
      st->cluster->transport()->Call(
          args, [st, op, payload, part = std::move(part), address, resolved](transport::Reply r) {
            std::vector<LookupResult> res;
            Status s = r.status;
            if (s.ok()) s = DecodeLookupReply(r.payload, part.size(), &res);
            if (s.ok()) {
              for (size_t j = 0; j < part.size(); ++j) {
                st->CachePut(op->keys[part[j]], res[j]);
                op->results[part[j]] = std::move(res[j]);
              }
            } else {
              st->lookup_errors->Inc();
              st->NoteFailure(address, s);
              LogDebug("lookup at {}: {}", address, s.ToString());
            }
            resolved(std::move(part), ResolvedOn::kTransportThread);
          });
    }
  }
  if (!now.empty()) resolved(std::move(now), ResolvedOn::kCaller);
}

// An exists: counts the keys resolved and answers once all are.
struct ExistsOp : LookupState {
  std::atomic<size_t> pending{0};
  RemoteSource::ExistsDone done;
};

// A fetch: each key is fetched from its next candidate holder into a
// reserved local DRAM slot as soon as its home answered.
struct FetchOp : LookupState {
  std::vector<TieredStore::Reservation> slots;
  std::vector<std::vector<std::string>> peers;  // candidate holders per key
  std::mutex mu;
  std::vector<TieredStore::Pin> pins;  // protected by mu
  // Keys not finished yet, plus one held until the lookups are all out, so
  // `done` never runs inside Fetch().
  std::atomic<size_t> pending{0};
  RemoteSource::FetchDone done;

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

// Fetches key i of op from its next candidate holder into its reserved
// slot; on failure tries the next one, then gives up (a miss).
void IssueFetch(const std::shared_ptr<RemoteReader::State>& st, const std::shared_ptr<FetchOp>& op,
                size_t i, size_t attempt) {
  const std::string& peer = op->peers[i][attempt];
  uint64_t size = op->slots[i].size();
  std::vector<uint8_t> request;
  EncodeFetch(op->keys[i], size, &request);
  transport::CallArgs args;
  args.peer = peer;
  args.type = kPeerFetch;
  args.request = request;
  args.sink = op->slots[i].bytes();
  args.deadline = Clock::now() + st->opts.fetch_timeout;
  st->fetches->Inc();
  st->cluster->transport()->Call(args, [st, op, i, attempt](transport::Reply rep) {
    const std::string& peer = op->peers[i][attempt];
    uint64_t got = 0;
    Status s = rep.status;
    if (s.ok()) s = DecodeFetchReply(rep.header, &got);
    if (s.ok() && (got != op->slots[i].size() || rep.payload_bytes != got)) {
      s = Corruption("fetch reply size does not match the directory's");
    }
    if (s.ok()) {
      auto pin = st->store->CommitAndAcquire(std::move(op->slots[i]), WriteOrigin::kCopy);
      if (pin.ok()) {
        st->hits->Inc();
        st->fetch_bytes->Inc(got);
        op->AddPin(std::move(pin).value());
      } else {
        st->misses->Inc();
      }
      op->Finished(1);
      return;
    }
    if (s.code() != StatusCode::kNotFound) st->fetch_errors->Inc();
    st->NoteFailure(peer, s);
    LogDebug("fetch {} from {}: {}", op->keys[i].ToHex(), peer, s.ToString());
    if (attempt + 1 < op->peers[i].size()) {
      // The next holder, from the executor (this is a transport thread).
      st->Continue(
          st, [st, op, i, attempt] { IssueFetch(st, op, i, attempt + 1); },
          [st, op, i] {
            op->slots[i].Reset();
            st->misses->Inc();
            op->Finished(1);
          });
      return;
    }
    op->slots[i].Reset();
    st->CacheDrop(op->keys[i]);  // every holder failed: ask the home next time
    st->misses->Inc();
    op->Finished(1);
  });
}

// Reserves slots for the resolved keys idx of op and fetches them. Runs
// inside the gate; on a transport thread only without an SSD tier (with one,
// Reserve may wait for room on SSD).
void StartFetches(const std::shared_ptr<RemoteReader::State>& st,
                  const std::shared_ptr<FetchOp>& op, const std::vector<size_t>& idx) {
  auto view = st->cluster->view();
  size_t misses = 0, finished = 0;
  std::vector<size_t> to_fetch;
  for (size_t i : idx) {
    const KeyId& key = op->keys[i];
    const LookupResult& r = op->results[i];
    if (r.size > 0) op->peers[i] = Candidates(*st, *view, r);
    if (op->peers[i].empty()) {
      ++misses;
      continue;
    }
    auto slot = st->store->Reserve(key, r.size);
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
    to_fetch.push_back(i);
  }
  for (size_t i : to_fetch) IssueFetch(st, op, i, 0);
  st->misses->Inc(misses);
  op->Finished(misses + finished);
}

}  // namespace

RemoteReader::RemoteReader(const RemoteReaderOptions& options, Cluster* cluster,
                           Directory* directory, TieredStore* store, Executor* executor, MetricsRegistry* m)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.opts = options;
  s.cluster = cluster;
  s.directory = directory;
  s.store = store;
  s.executor = executor;
  s.lookups = m->GetCounter("kvpool_remote_lookups_total", "Keys looked up at their home nodes");
  s.fetches = m->GetCounter("kvpool_remote_fetches_total", "Values fetched from peers");
  s.fetch_bytes = m->GetCounter("kvpool_remote_fetch_bytes_total", "Value bytes fetched from peers");
  s.hits = m->GetCounter("kvpool_remote_hits_total", "Local misses served from a peer");
  s.misses = m->GetCounter("kvpool_remote_misses_total", "Local misses no peer could serve");
  s.lookup_errors = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                                  {{"op", "lookup"}});
  s.fetch_errors = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                                 {{"op", "fetch"}});
  s.cache_hits = m->GetCounter("kvpool_remote_lookup_cache_hits_total",
                               "Keys answered from the short-lived lookup cache");
  s.cooldowns = m->GetCounter("kvpool_peer_cooldowns_total",
                              "Times a peer was set aside after Unavailable or a timeout");
}

RemoteReader::~RemoteReader() { Shutdown(); }

void RemoteReader::Shutdown() {
  std::unique_lock lock(state_->mu);
  state_->stopping = true;
  state_->idle.wait(lock, [this] { return state_->active == 0; });
}

void RemoteReader::Fetch(std::vector<KeyId> keys, FetchDone done) {
  auto st = state_;
  if (keys.empty() || st->cluster->fenced() || !st->Enter()) {
    if (!keys.empty()) st->misses->Inc(keys.size());
    done({});
    return;
  }
  auto op = std::make_shared<FetchOp>();
  op->keys = std::move(keys);
  op->slots.resize(op->keys.size());
  op->peers.resize(op->keys.size());
  op->done = std::move(done);
  op->pending.store(op->keys.size() + 1, std::memory_order_relaxed);
  StartLookup(st, op, [st, op](std::vector<size_t> idx, ResolvedOn on) {
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

void RemoteReader::Exists(std::vector<KeyId> keys, ExistsDone done) {
  auto st = state_;
  if (keys.empty() || st->cluster->fenced() || !st->Enter()) {
    done({});
    return;
  }
  auto op = std::make_shared<ExistsOp>();
  op->keys = std::move(keys);
  op->done = std::move(done);
  op->pending.store(op->keys.size(), std::memory_order_relaxed);
  auto answer = [st, op] {
    auto view = st->cluster->view();
    std::vector<KeyId> hits;
    for (size_t i = 0; i < op->keys.size(); ++i) {
      if (op->results[i].size > 0 && !Candidates(*st, *view, op->results[i]).empty()) {
        hits.push_back(op->keys[i]);
      }
    }
    op->done(std::move(hits));
  };
  StartLookup(st, op, [st, op, answer](std::vector<size_t> idx, ResolvedOn on) {
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
