#include "cluster/anti_entropy.h"

#include <time.h>

#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cluster/peer_handler.h"
#include "common/log.h"
#include "membership/shard_map.h"
#include "peer/peer_messages_format.h"

namespace kvpool::cluster {
namespace {

using SteadyClock = std::chrono::steady_clock;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<bool> OwnedBy(const ShardMap& map, const std::string& node_id) {
  std::vector<bool> owned(kNumShards, false);
  for (uint32_t s = 0; s < kNumShards; ++s) {
    const Member* h = map.Home(s);
    owned[s] = h != nullptr && h->node_id == node_id;
  }
  return owned;
}

// Replies of calls made together; the round waits for all of them (each
// call's callback runs by its deadline).
struct Calls {
  std::mutex mu;
  std::condition_variable cv;
  size_t left = 0;                   // protected by mu
  std::vector<transport::Reply> replies;  // protected by mu

  void Wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  }
};

}  // namespace

Status AntiEntropyOptions::Validate() const {
  if (interval.count() < 0) return InvalidArgument("anti-entropy interval < 0");
  if (timeout.count() <= 0) return InvalidArgument("anti-entropy timeout <= 0");
  return Status::Ok();
}

struct AntiEntropy::Impl {
  AntiEntropyOptions opts;
  Cluster* cluster;
  Directory* directory;
  HoldingsAnnouncer* announcer;
  TieredStore* store;

  Counter* rounds;
  Counter* cpu_us;
  Counter* listed;
  Counter* bytes_sent;
  Counter* bytes_received;
  Counter* mismatched;
  Counter* republished;
  Counter* unpublished;
  Counter* errors;

  std::mutex round_mu;  // one round at a time
  std::mutex mu;
  bool stop = false;  // protected by mu
  std::unique_ptr<ThreadScheduler> own_scheduler;  // when opts.scheduler is null
  Scheduler::JobId rounds_job = 0;                 // 0: not started

  bool Stopping() {
    std::lock_guard lock(mu);
    return stop;
  }

  // Calls fn(key, size) once per key held here (TieredStore::ListHeld).
  // want: kNumShards flags (null: every shard).
  uint64_t ListInventory(const std::vector<bool>* want,
                         const std::function<void(const KeyId&, uint64_t)>& fn) {
    SsdKeyFilter in_want;
    if (want != nullptr) in_want = [want](uint64_t hi) { return (*want)[ShardOf(KeyId{hi, 0})]; };
    return store->ListHeld(in_want, [&](const KeyId& k, uint64_t size, HoldingTier tier) {
      fn(k, size);
      return tier == HoldingTier::kDram || !Stopping();
    });
  }

  // Sends the calls together and waits for every reply.
  std::vector<transport::Reply> CallAll(const std::vector<std::string>& peers,
                                        transport::MessageType type,
                                        std::vector<std::vector<uint8_t>> payloads) {
    auto calls = std::make_shared<Calls>();
    calls->left = peers.size();
    calls->replies.resize(peers.size());
    auto bodies = std::make_shared<std::vector<std::vector<uint8_t>>>(std::move(payloads));
    for (size_t i = 0; i < peers.size(); ++i) {
      bytes_sent->Inc((*bodies)[i].size());
      transport::CallArgs args;
      args.peer = peers[i];
      args.type = type;
      args.payload = (*bodies)[i];
      args.deadline = transport::SteadyClock::now() + opts.timeout;
      cluster->transport()->Call(args, [calls, bodies, i](transport::Reply r) {
        std::lock_guard lock(calls->mu);
        calls->replies[i] = std::move(r);
        if (--calls->left == 0) calls->cv.notify_all();
      });
    }
    calls->Wait();
    std::vector<transport::Reply> out;
    {
      std::lock_guard lock(calls->mu);
      out = std::move(calls->replies);
    }
    for (const auto& r : out) {
      if (r.status.ok()) {
        bytes_received->Inc(r.payload.size());
      } else {
        errors->Inc();
      }
    }
    return out;
  }

  // The keys a home lists for this node in `shards`; false when it could
  // not be asked.
  bool HomeKeys(const Member& home, bool local, const std::string& self, uint64_t inc,
                const std::vector<uint32_t>& shards, std::unordered_set<KeyId, KeyIdHash>* out) {
    uint32_t first = 0;
    while (first < shards.size()) {
      uint32_t next = 0;
      std::vector<KeyId> keys;
      if (local) {
        keys = directory->KeysOf(self, inc, shards, first, &next);
      } else {
        ShardKeysRequest req{self, inc, first, shards};
        std::vector<uint8_t> body;
        EncodeShardKeys(req, &body);
        auto replies = CallAll({home.address}, kPeerShardKeys, {std::move(body)});
        ShardKeysReply rep;
        if (!replies[0].status.ok()) return false;
        Status st = DecodeShardKeysReply(replies[0].payload, &rep);
        if (!st.ok() || rep.next <= first || rep.next > shards.size()) {
          LogWarn("anti-entropy: bad shard keys reply from {}: {}", home.node_id,
                  st.ok() ? "no progress" : st.ToString());
          errors->Inc();
          return false;
        }
        next = rep.next;
        keys = std::move(rep.keys);
      }
      out->insert(keys.begin(), keys.end());
      first = next;
    }
    return true;
  }

  void Round() {
    std::lock_guard round_lock(round_mu);
    if (cluster->fenced()) return;  // it replays everything when it is back
    const double cpu0 = ThreadCpuSeconds();
    auto map = cluster->shard_map();
    auto view = cluster->view();
    if (map->empty()) return;
    const std::string& self = cluster->node_id();
    const uint64_t inc = cluster->incarnation();

    std::vector<uint32_t> keys(kNumShards, 0);
    std::vector<uint64_t> sums(kNumShards, 0);
    listed->Inc(ListInventory(nullptr, [&](const KeyId& k, uint64_t) {
      uint32_t s = ShardOf(k);
      ++keys[s];
      sums[s] += ShardDigestOf(k);
    }));

    // One digest per member, also to homes of no shard with keys here: it
    // carries this node's incarnation (static members learn restarts).
    std::map<std::string, DigestRequest> requests;
    for (const Member& m : view->members) {
      requests[m.node_id] = DigestRequest{self, inc, map->fingerprint(), {}};
    }
    for (uint32_t s = 0; s < kNumShards; ++s) {
      const Member* h = map->Home(s);
      if (h == nullptr || keys[s] == 0) continue;
      auto it = requests.find(h->node_id);
      if (it != requests.end()) it->second.shards.push_back({s, keys[s], sums[s]});
    }
    std::map<std::string, std::vector<uint32_t>> diff;  // home node id -> shards
    std::vector<std::string> peers, ids;
    std::vector<std::vector<uint8_t>> bodies;
    for (const auto& [id, req] : requests) {
      if (id == self) {
        auto d = directory->MismatchedShards(self, inc, req.shards, OwnedBy(*map, self));
        if (!d.empty()) diff[id] = std::move(d);
        continue;
      }
      const Member* m = view->Find(id);
      if (m == nullptr) continue;
      peers.push_back(m->address);
      ids.push_back(id);
      bodies.emplace_back();
      EncodeDigest(req, &bodies.back());
    }
    auto replies = CallAll(peers, kPeerDigest, std::move(bodies));
    for (size_t i = 0; i < replies.size(); ++i) {
      if (!replies[i].status.ok()) {
        LogDebug("anti-entropy: digest to {}: {}", ids[i], replies[i].status.ToString());
        continue;
      }
      DigestReply rep;
      Status st = DecodeDigestReply(replies[i].payload, &rep);
      if (!st.ok()) {
        LogWarn("anti-entropy: digest reply from {}: {}", ids[i], st.ToString());
        errors->Inc();
        continue;
      }
      cluster->ObservePeer(ids[i], rep.incarnation);
      if (!rep.maps_differ && !rep.mismatched.empty()) diff[ids[i]] = std::move(rep.mismatched);
    }

    if (!diff.empty() && !Stopping()) Repair(*map, *view, self, inc, diff);
    rounds->Inc();
    cpu_us->Inc(static_cast<uint64_t>((ThreadCpuSeconds() - cpu0) * 1e6));
  }

  // Fixes the shards whose digests differed: see the header for why each
  // fix is followed by a look at the store.
  void Repair(const ShardMap& map, const MembershipView& view, const std::string& self,
              uint64_t inc, const std::map<std::string, std::vector<uint32_t>>& diff) {
    std::vector<bool> want(kNumShards, false);
    std::unordered_set<KeyId, KeyIdHash> theirs;
    uint64_t shards = 0;
    for (const auto& [id, list] : diff) {
      const Member* home = view.Find(id);
      if (home == nullptr) continue;
      if (!HomeKeys(*home, id == self, self, inc, list, &theirs)) continue;
      for (uint32_t s : list) {
        // Only shards whose home still is this one (the map may have moved).
        const Member* h = map.Home(s);
        if (h != nullptr && h->node_id == id) want[s] = true;
      }
      shards += list.size();
    }
    mismatched->Inc(shards);
    std::unordered_map<KeyId, uint64_t, KeyIdHash> mine;
    ListInventory(&want, [&](const KeyId& k, uint64_t size) { mine.emplace(k, size); });
    uint64_t added = 0, removed = 0;
    for (const auto& [k, size] : mine) {
      if (theirs.count(k) != 0) continue;
      announcer->Relist(k, size);
      if (!store->Contains(k)) announcer->Unlist(k);  // dropped since the listing
      ++added;
    }
    for (const KeyId& k : theirs) {
      if (!want[ShardOf(k)] || mine.count(k) != 0) continue;
      announcer->Unlist(k);
      if (store->Contains(k)) {  // stored since the listing
        auto size = store->SizeOf(k);
        if (size.ok()) announcer->Relist(k, *size);
      }
      ++removed;
    }
    republished->Inc(added);
    unpublished->Inc(removed);
    if (added + removed > 0) {
      LogInfo("anti-entropy: {} shards differed: {} keys published again, {} unpublished", shards,
              added, removed);
    }
  }

  Status OnDigest(const transport::Incoming& in, transport::Responder& r) {
    DigestRequest req;
    KVPOOL_RETURN_IF_ERROR(DecodeDigest(in.payload, &req));
    cluster->ObservePeer(req.node_id, req.incarnation);
    auto map = cluster->shard_map();
    DigestReply rep;
    rep.incarnation = cluster->incarnation();
    rep.maps_differ = req.fingerprint != map->fingerprint();
    if (!rep.maps_differ) {
      rep.mismatched = directory->MismatchedShards(req.node_id, req.incarnation, req.shards,
                                                   OwnedBy(*map, cluster->node_id()));
    }
    RespondEncoded(r, [&](std::vector<uint8_t>* out) { EncodeDigestReply(rep, out); });
    return Status::Ok();
  }

  Status OnShardKeys(const transport::Incoming& in, transport::Responder& r) {
    ShardKeysRequest req;
    KVPOOL_RETURN_IF_ERROR(DecodeShardKeys(in.payload, &req));
    ShardKeysReply rep;
    rep.keys = directory->KeysOf(req.node_id, req.incarnation, req.shards, req.first, &rep.next);
    RespondEncoded(r, [&](std::vector<uint8_t>* out) { EncodeShardKeysReply(rep, out); });
    return Status::Ok();
  }
};

AntiEntropy::AntiEntropy(const AntiEntropyOptions& options, Cluster* cluster, Directory* directory,
                         HoldingsAnnouncer* announcer, TieredStore* store, MetricsRegistry* m)
    : impl_(std::make_unique<Impl>()) {
  Impl& i = *impl_;
  i.opts = options;
  i.cluster = cluster;
  i.directory = directory;
  i.announcer = announcer;
  i.store = store;
  i.rounds = m->GetCounter("kvpool_anti_entropy_rounds_total", "Anti-entropy rounds run");
  i.cpu_us = m->GetCounter("kvpool_anti_entropy_cpu_microseconds_total",
                           "CPU time of anti-entropy rounds on the holder (listing, digests, "
                           "repairs), microseconds");
  i.listed = m->GetCounter("kvpool_anti_entropy_entries_listed_total",
                           "Inventory entries listed for anti-entropy digests");
  i.bytes_sent = m->GetCounter("kvpool_anti_entropy_bytes_total",
                               "Anti-entropy payload bytes (digests, shard key lists)",
                               {{"dir", "sent"}});
  i.bytes_received = m->GetCounter("kvpool_anti_entropy_bytes_total",
                                   "Anti-entropy payload bytes (digests, shard key lists)",
                                   {{"dir", "received"}});
  i.mismatched = m->GetCounter("kvpool_anti_entropy_mismatched_shards_total",
                               "Shards whose digest differed between this holder and their home");
  i.republished = m->GetCounter("kvpool_anti_entropy_republished_total",
                                "Keys published again because their home did not list them");
  i.unpublished = m->GetCounter("kvpool_anti_entropy_unpublished_total",
                                "Keys unpublished because their home listed them but this node "
                                "does not hold them");
  i.errors = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                           {{"op", "anti_entropy"}});
  Impl* p = impl_.get();
  ServePeer(cluster, m, {kPeerDigest, "digest"},
            [p](transport::Incoming& in, transport::Responder& r) { return p->OnDigest(in, r); });
  ServePeer(
      cluster, m, {kPeerShardKeys, "shard_keys"},
      [p](transport::Incoming& in, transport::Responder& r) { return p->OnShardKeys(in, r); });
}

AntiEntropy::~AntiEntropy() { Stop(); }

void AntiEntropy::Stop() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  if (impl_->rounds_job != 0) {
    Scheduler* s =
        impl_->opts.scheduler != nullptr ? impl_->opts.scheduler : impl_->own_scheduler.get();
    s->Cancel(impl_->rounds_job);  // waits for a running round
    impl_->rounds_job = 0;
  }
  impl_->own_scheduler.reset();
}

void AntiEntropy::Start() {
  if (impl_->opts.interval.count() == 0 || impl_->rounds_job != 0) return;
  Scheduler* s = impl_->opts.scheduler;
  if (s == nullptr) {
    impl_->own_scheduler = std::make_unique<ThreadScheduler>("kvpool-antientr");
    s = impl_->own_scheduler.get();
  }
  // The first round at once, then one `interval` after each ends.
  impl_->rounds_job = s->RunEvery(
      impl_->opts.interval, [i = impl_.get()] { i->Round(); }, Clock::duration::zero());
}

void AntiEntropy::RunRound() { impl_->Round(); }

}  // namespace kvpool::cluster
