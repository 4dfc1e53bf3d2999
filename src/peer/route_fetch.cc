#include "peer/route_fetch.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/log.h"
#include "common/thread_annotations.h"

namespace kvpool::cluster {

using SteadyClock = std::chrono::steady_clock;

// What the calls in flight share; their callbacks hold it, so it lives as
// long as the last of them.
struct RouteFetcher::State {
  RouteFetcherOptions opts;
  transport::Transport* transport = nullptr;
  const Clock* clock = nullptr;
  std::unique_ptr<MetricsRegistry> own_metrics;  // when none was given

  Counter* lookups = nullptr;
  Counter* holder_lookups = nullptr;
  Counter* fetches = nullptr;
  Counter* lookup_errors = nullptr;
  Counter* fetch_errors = nullptr;
  Counter* cooldowns = nullptr;
  Counter* cache_hits = nullptr;

  struct Cached {
    LookupResult result;
    Clock::time_point at;  // when the home answered
  };
  // How long an answer is reused now, in microseconds (see
  // RouteFetcherOptions: halved by stale answers, grown by fetches served).
  std::atomic<int64_t> ttl_us{0};
  // RouteFetcher::BoundReuse.
  std::atomic<int64_t> reuse_bound_us{std::numeric_limits<int64_t>::max()};
  int64_t full_ttl_us = 0;  // lookup_cache_ttl
  Gauge* ttl_gauge = nullptr;
  Counter* stale_answers = nullptr;
  std::mutex mu;
  // Peers avoided until the time point.
  std::unordered_map<std::string, Clock::time_point> cooling GUARDED_BY(mu);
  // The last view's incarnation per member address, and that view's epoch:
  // a member seen under a new incarnation, or again after it left the view
  // (restarted, or joined after waiting for its old lease), is a new
  // process, and a cool-down earned by the old one, or by it while it was
  // still joining, is dropped.
  std::atomic<int64_t> seen_epoch{-1};  // none yet
  std::unordered_map<std::string, uint64_t> incarnations GUARDED_BY(mu);

  void NoteView(const MembershipView& view) {
    // Views only move forward: an older one a lookup still carries changes
    // nothing (or a dead peer would lose its cool-down at each interleave).
    const auto epoch = static_cast<int64_t>(view.epoch);
    if (epoch <= seen_epoch.load(std::memory_order_acquire)) return;
    std::lock_guard lock(mu);
    if (epoch <= seen_epoch.load(std::memory_order_relaxed)) return;
    std::unordered_map<std::string, uint64_t> now;
    for (const Member& m : view.members) {
      now[m.address] = m.incarnation;
      auto before = incarnations.find(m.address);
      // New in this view, or back under another incarnation.
      if (before == incarnations.end() || before->second != m.incarnation) {
        cooling.erase(m.address);
      }
    }
    incarnations = std::move(now);
    seen_epoch.store(epoch, std::memory_order_release);
  }
  // Positive lookup answers from remote homes, until their expiry: an
  // exists followed by a get asks the home once.
  std::unordered_map<KeyId, Cached, KeyIdHash> cache GUARDED_BY(mu);

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
    const auto ttl = std::chrono::microseconds(std::min(
        ttl_us.load(std::memory_order_relaxed), reuse_bound_us.load(std::memory_order_relaxed)));
    if (clock->Now() >= it->second.at + ttl || it->second.result.holders.empty()) {
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
    cache[key] = {r, clock->Now()};
  }
  // Drops key's answer; true when there was one.
  bool CacheDrop(const KeyId& key) {
    if (opts.lookup_cache_ttl.count() == 0) return false;
    std::lock_guard lock(mu);
    return cache.erase(key) > 0;
  }
  void SetTtl(int64_t us) {
    ttl_us.store(us, std::memory_order_relaxed);
    ttl_gauge->Set(std::min(us, reuse_bound_us.load(std::memory_order_relaxed)));
  }
  // Every holder an answer named had dropped the value: answers are
  // reused for half as long. (Concurrent updates may lose one another;
  // the TTL only needs to settle, not to count exactly.)
  void NoteStale() {
    stale_answers->Inc();
    const int64_t floor = full_ttl_us / RouteFetcherOptions::kTtlFloorDivisor;
    SetTtl(std::max<int64_t>(floor, ttl_us.load(std::memory_order_relaxed) / 2));
  }
  // A fetch served: answers are reused a little longer, up to the TTL.
  void NoteServed() {
    const int64_t now = ttl_us.load(std::memory_order_relaxed);
    if (now >= full_ttl_us) return;
    SetTtl(std::min(full_ttl_us,
                    now + std::max<int64_t>(1, now / RouteFetcherOptions::kTtlGrowthDivisor)));
  }

  bool Cooling(const std::string& address) {
    if (opts.cooldown.count() == 0) return false;
    std::lock_guard lock(mu);
    auto it = cooling.find(address);
    if (it == cooling.end()) return false;
    if (clock->Now() >= it->second) {
      cooling.erase(it);
      return false;
    }
    return true;
  }

  void NoteFailure(const std::string& address, const Status& s) {
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded) return;
    if (opts.cooldown.count() == 0) return;
    std::lock_guard lock(mu);
    cooling[address] = clock->Now() + opts.cooldown;
    cooldowns->Inc();
  }
};

// One value's way through its candidate holders.
struct RouteFetcher::Walk {
  std::shared_ptr<State> st;
  FetchRequest req;
  Retry retry;
  FetchDone done;
  size_t attempt = 0;
};

RouteFetcher::RouteFetcher(const RouteFetcherOptions& options, transport::Transport* transport,
                           MetricsRegistry* m, const Clock* clock)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.opts = options;
  s.transport = transport;
  s.clock = clock;
  if (m == nullptr) {
    s.own_metrics = std::make_unique<MetricsRegistry>();
    m = s.own_metrics.get();
  }
  s.lookups = m->GetCounter("kvpool_remote_lookups_total", "Keys looked up at their home nodes");
  s.holder_lookups =
      m->GetCounter("kvpool_remote_holder_lookups_total",
                    "Keys a chain read asked the holder of its first block about, not their homes");
  s.fetches = m->GetCounter("kvpool_remote_fetches_total", "Values fetched from peers");
  s.lookup_errors = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                                  {{"op", "lookup"}});
  s.fetch_errors = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                                 {{"op", "fetch"}});
  s.cache_hits = m->GetCounter("kvpool_remote_lookup_cache_hits_total",
                               "Keys answered from the short-lived lookup cache");
  s.stale_answers = m->GetCounter(
      "kvpool_remote_lookup_stale_answers_total",
      "Fetches that found every holder a cached lookup answer named without the value");
  s.ttl_gauge = m->GetGauge("kvpool_remote_lookup_cache_ttl_microseconds",
                            "How long a lookup answer is reused now: --peer-lookup-cache-ttl, "
                            "less after stale answers");
  s.full_ttl_us =
      std::chrono::duration_cast<std::chrono::microseconds>(options.lookup_cache_ttl).count();
  s.SetTtl(s.full_ttl_us);
  s.cooldowns = m->GetCounter("kvpool_peer_cooldowns_total",
                              "Times a peer was set aside after Unavailable or a timeout");
}

RouteFetcher::~RouteFetcher() = default;

bool RouteFetcher::Cooling(const std::string& address) { return state_->Cooling(address); }

void RouteFetcher::Lookup(const Routes& routes, const std::shared_ptr<LookupBatch>& batch,
                          const std::vector<size_t>& idx, transport::Deadline deadline,
                          const LocalLookup& local, Resolved resolved) {
  const std::shared_ptr<State>& st = state_;
  st->lookups->Inc(idx.size());
  st->NoteView(*routes.view);
  std::map<std::string, std::vector<size_t>> groups;  // home address -> key indexes
  std::vector<KeyId> local_keys;
  std::vector<size_t> local_idx, now, no_home, cooling;
  std::string cooling_home;
  for (size_t i : idx) {
    const KeyId& key = batch->keys[i];
    const Member* home = routes.map->HomeOf(key);
    if (home == nullptr) {
      no_home.push_back(i);
    } else if (!routes.self.empty() && home->node_id == routes.self) {
      local_keys.push_back(key);
      local_idx.push_back(i);
    } else if (st->CacheGet(key, *routes.view, &batch->results[i])) {
      st->cache_hits->Inc();
      now.push_back(i);
    } else if (!st->Cooling(home->address)) {
      groups[home->address].push_back(i);
    } else {
      cooling.push_back(i);
      cooling_home = home->address;
    }
  }
  if (!local_keys.empty()) {
    auto res = local(local_keys);
    for (size_t j = 0; j < res.size(); ++j) batch->results[local_idx[j]] = std::move(res[j]);
    now.insert(now.end(), local_idx.begin(), local_idx.end());
  }
  // The remote lookups go out first: their round trips overlap the local
  // lookups and the caller's handling of the keys resolved here.
  for (auto& [address, keys_idx] : groups) {
    SendLookups(st, batch, keys_idx, address, kPeerLookup, deadline, resolved);
  }
  if (!no_home.empty()) {
    resolved(std::move(no_home), Unavailable("the cluster has no member that owns shards"),
             ResolvedOn::kCaller);
  }
  if (!cooling.empty()) {
    resolved(std::move(cooling), Unavailable(fmt::format("{} is cooling down", cooling_home)),
             ResolvedOn::kCaller);
  }
  if (!now.empty()) resolved(std::move(now), Status::Ok(), ResolvedOn::kCaller);
}

void RouteFetcher::AskHolder(const Routes& routes, const std::shared_ptr<LookupBatch>& batch,
                             const std::vector<size_t>& idx, const std::string& address,
                             transport::Deadline deadline, Resolved resolved) {
  const std::shared_ptr<State>& st = state_;
  st->NoteView(*routes.view);
  std::vector<size_t> ask, now;
  for (size_t i : idx) {
    if (st->CacheGet(batch->keys[i], *routes.view, &batch->results[i])) {
      st->cache_hits->Inc();
      now.push_back(i);
    } else {
      ask.push_back(i);
    }
  }
  st->holder_lookups->Inc(ask.size());
  SendLookups(st, batch, ask, address, kPeerHolderLookup, deadline, resolved);
  if (!now.empty()) resolved(std::move(now), Status::Ok(), ResolvedOn::kCaller);
}

void RouteFetcher::SendLookups(const std::shared_ptr<State>& st,
                               const std::shared_ptr<LookupBatch>& batch,
                               const std::vector<size_t>& idx, const std::string& address,
                               transport::MessageType base, transport::Deadline deadline,
                               const Resolved& resolved) {
  for (size_t start = 0; start < idx.size(); start += kMaxPeerBatch) {
    size_t end = std::min(idx.size(), start + kMaxPeerBatch);
    std::vector<size_t> part(idx.begin() + static_cast<ptrdiff_t>(start),
                             idx.begin() + static_cast<ptrdiff_t>(end));
    std::vector<KeyId> keys;
    for (size_t i : part) keys.push_back(batch->keys[i]);
    auto payload = std::make_shared<std::vector<uint8_t>>();
    EncodeLookup(keys, payload.get());
    std::vector<uint8_t> scope;  // copied by Call
    EncodeTenantScope(st->opts.tenant, {}, &scope);
    transport::CallArgs args;
    args.peer = address;
    args.type = ScopedType(base, st->opts.tenant);
    args.request = scope;
    args.payload = *payload;
    args.deadline = deadline;
    st->transport->Call(args, [st, batch, payload, part = std::move(part), address,
                               resolved](transport::Reply r) mutable {
      std::vector<LookupResult> res;
      Status s = r.status;
      if (s.ok()) s = DecodeLookupReply(r.payload, part.size(), &res);
      if (s.ok()) {
        for (size_t j = 0; j < part.size(); ++j) {
          st->CachePut(batch->keys[part[j]], res[j]);
          batch->results[part[j]] = std::move(res[j]);
        }
      } else {
        st->lookup_errors->Inc();
        st->NoteFailure(address, s);
        LogDebug("lookup at {}: {}", address, s.ToString());
        s = Status(s.code(), fmt::format("lookup at {}: {}", address, s.message()));
      }
      resolved(std::move(part), s, ResolvedOn::kTransportThread);
    });
  }
}

std::vector<std::string> RouteFetcher::Candidates(const Routes& routes, const LookupResult& r) {
  std::vector<std::string> out;
  for (const auto& h : r.holders) {
    if (!routes.self.empty() && h.node_id == routes.self) continue;
    const Member* m = routes.view->Find(h.node_id);
    if (m == nullptr || (m->incarnation != 0 && m->incarnation != h.incarnation)) continue;
    if (state_->Cooling(m->address)) continue;
    if (std::find(out.begin(), out.end(), m->address) != out.end()) continue;
    out.push_back(m->address);
  }
  return out;
}

void RouteFetcher::BoundReuse(std::chrono::microseconds bound) {
  State& s = *state_;
  s.reuse_bound_us.store(bound.count(), std::memory_order_relaxed);
  s.ttl_gauge->Set(std::min(bound.count(), s.ttl_us.load(std::memory_order_relaxed)));
}

std::vector<std::string> RouteFetcher::CachedCandidates(const Routes& routes, const KeyId& key) {
  LookupResult r;
  if (!state_->CacheGet(key, *routes.view, &r)) return {};
  return Candidates(routes, r);
}

void RouteFetcher::Fetch(FetchRequest request, Retry retry, FetchDone done) {
  auto walk = std::make_shared<Walk>();
  walk->st = state_;
  walk->req = std::move(request);
  walk->retry = std::move(retry);
  walk->done = std::move(done);
  if (walk->req.peers.empty()) {
    walk->done(NotFound("no holder to fetch from"), 0);
    return;
  }
  if (SteadyClock::now() >= walk->req.deadline) {
    walk->done(NotFound("the deadline passed before a holder was tried"), 0);
    return;
  }
  Attempt(walk);
}

void RouteFetcher::Attempt(const std::shared_ptr<Walk>& walk) {
  State& st = *walk->st;
  const FetchRequest& req = walk->req;
  const std::string& peer = req.peers[walk->attempt];
  uint64_t max_size = req.expected_size > 0 ? req.expected_size : req.sink.size();
  std::vector<uint8_t> fetch, request;
  EncodeFetch(req.key, max_size, &fetch);
  EncodeTenantScope(st.opts.tenant, fetch, &request);
  transport::CallArgs args;
  args.peer = peer;
  args.type = ScopedType(kPeerFetch, st.opts.tenant);
  args.request = request;
  args.sink = req.sink;
  args.deadline = req.deadline;
  if (req.per_attempt.count() > 0) {
    args.deadline = std::min(req.deadline, SteadyClock::now() + req.per_attempt);
  }
  st.fetches->Inc();
  st.transport->Call(args, [walk](transport::Reply rep) {
    State& st = *walk->st;
    const FetchRequest& req = walk->req;
    const std::string& peer = req.peers[walk->attempt];
    uint64_t got = 0;
    Status s = rep.status;
    if (s.ok()) s = DecodeFetchReply(rep.header, &got);
    if (s.ok() && rep.payload_bytes != got) {
      s = Corruption("fetch reply size does not match its payload");
    } else if (s.ok() && req.expected_size > 0 && got != req.expected_size) {
      s = Corruption("fetch reply size does not match the directory's");
    }
    if (s.ok()) {
      st.NoteServed();
      walk->done(s, got);
      return;
    }
    if (s.code() != StatusCode::kNotFound) st.fetch_errors->Inc();
    st.NoteFailure(peer, s);
    LogDebug("fetch {} from {}: {}", req.key.ToHex(), peer, s.ToString());
    bool too_small = req.expected_size == 0 && s.code() == StatusCode::kResourceExhausted;
    if (too_small || walk->attempt + 1 >= req.peers.size()) {
      // Every holder failed: ask the home next time.
      if (!too_small && st.CacheDrop(req.key) && s.code() == StatusCode::kNotFound) st.NoteStale();
      walk->done(s, 0);
      return;
    }
    if (SteadyClock::now() >= req.deadline) {
      walk->done(NotFound("the deadline passed before the next holder was tried"), 0);
      return;
    }
    ++walk->attempt;
    Next(walk);
  });
}

void RouteFetcher::Next(const std::shared_ptr<Walk>& walk) {
  if (!walk->retry) return Attempt(walk);
  walk->retry([walk](bool go) {
    if (go) {
      Attempt(walk);
    } else {
      walk->done(Aborted("shutting down"), 0);
    }
  });
}

}  // namespace kvpool::cluster
