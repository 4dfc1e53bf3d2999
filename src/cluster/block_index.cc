#include "cluster/block_index.h"

#include <fmt/format.h>

#include <map>
#include <unordered_map>

#include "cluster/peer_handler.h"
#include "common/gate.h"
#include "common/log.h"
#include "membership/shard_map.h"

namespace kvpool::cluster {

using transport::Incoming;
using transport::Responder;

KeyId BlockIndexKey(uint64_t hash, blocks::BlockTier tier) {
  std::string b(9, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(hash >> (56 - 8 * i));
  b[8] = static_cast<char>(tier);
  return MakeKeyId("kvpool.block-index", b);
}

Status BlockIndexOptions::Validate() const {
  if (max_entries < 1024) return InvalidArgument("block index: at least 1024 entries");
  if (max_fanout < 1) return InvalidArgument("block index: a lookup must ask one home at a time");
  if (max_hashes < 1 || max_hashes > 65536) {
    return InvalidArgument("block index: a lookup carries 1 to 65536 hashes");
  }
  return Status::Ok();
}

namespace {

DirectoryOptions IndexDirectory(uint64_t max_entries) {
  DirectoryOptions o;
  o.max_entries = max_entries;
  o.ghost_ratio = 0;
  return o;
}

PublisherOptions IndexPublish() {
  PublisherOptions o;
  o.type = kPeerBlockPublish;
  return o;
}

}  // namespace

struct BlockIndex::Impl {
  Impl(const BlockIndexOptions& o, Cluster* c, const blocks::DescriptorTable* t, Executor* e,
       MetricsRegistry* m)
      : opts(o),
        metrics(m),
        cluster(c),
        local(t),
        executor(e),
        directory(IndexDirectory(o.max_entries), &own_metrics),
        publisher(IndexPublish(), c, &directory, e, &own_metrics),
        lookups(m->GetCounter("kvpool_block_index_lookups_total",
                              "Prefix lookups answered (routers' questions)")),
        home_failures(m->GetCounter("kvpool_block_index_lookup_home_failures_total",
                                    "Index homes that did not answer a prefix lookup in time")),
        changes(m->GetCounter("kvpool_block_index_changes_total",
                              "Index keys this node published or unpublished (a block entering "
                              "or leaving one of its tiers)")) {}

  const BlockIndexOptions opts;
  MetricsRegistry* const metrics;
  Cluster* const cluster;
  const blocks::DescriptorTable* const local;
  Executor* const executor;
  MetricsRegistry own_metrics;  // the directory's and publisher's figures
  Directory directory;
  Publisher publisher;
  Counter* lookups;
  Counter* home_failures;
  Counter* changes;
  std::shared_ptr<Gate> gate = Gate::Shared();  // view work queued after destruction does nothing

  std::mutex run_mu;
  std::condition_variable run_cv;
  bool running = false;  // protected by run_mu
  std::thread flusher;

  // Only touched by the membership's callback thread.
  std::shared_ptr<const ShardMap> last_map;
  uint64_t last_incarnation = 0;

  void OnView(std::shared_ptr<const ShardMap> before, std::shared_ptr<const ShardMap> after,
              std::shared_ptr<const MembershipView> view, bool replay_all) {
    std::vector<bool> owned(kNumShards, false);
    for (uint32_t s = 0; s < kNumShards; ++s) {
      const Member* h = after->Home(s);
      owned[s] = h != nullptr && h->node_id == cluster->node_id();
    }
    directory.Prune(*view);
    directory.RetainShards(owned);
    std::vector<uint32_t> moved = ShardMap::Moved(*before, *after);
    if (moved.empty() && !replay_all) return;
    std::vector<bool> is_moved(kNumShards, replay_all);
    for (uint32_t s : moved) is_moved[s] = true;
    std::vector<KeyId> again;
    local->ForEachHeld([&](uint64_t hash, blocks::BlockTier tier) {
      const KeyId k = BlockIndexKey(hash, tier);
      if (is_moved[ShardOf(k)]) again.push_back(k);
    });
    for (const KeyId& k : again) publisher.Add(k, 0);
    LogDebug("block index: view {}: {} index keys published again", view->epoch, again.size());
  }

  void Flusher() {
    std::unique_lock lock(run_mu);
    while (running) {
      run_cv.wait_for(lock, opts.publish_interval, [&] { return !running; });
      if (!running) break;
      lock.unlock();
      publisher.Flush();
      lock.lock();
    }
  }
};

BlockIndex::BlockIndex(const BlockIndexOptions& options, Cluster* cluster,
                       const blocks::DescriptorTable* local, Executor* executor,
                       MetricsRegistry* metrics)
    : impl_(std::make_unique<Impl>(options, cluster, local, executor, metrics)) {
  Impl* im = impl_.get();
  im->last_map = cluster->shard_map();
  im->last_incarnation = cluster->incarnation();
  im->directory.Prune(*cluster->view());
  metrics->AddCallbackGauge(
      "kvpool_block_index_entries", "Index keys listed at this node as their home (block_index.h)",
      {}, [im] { return static_cast<double>(im->directory.entries()); }, this);
  ServePeer(cluster, metrics, {kPeerBlockPublish, "block_publish"},
            [im](Incoming& in, Responder& r) {
              PublishBatch batch;
              KVPOOL_RETURN_IF_ERROR(DecodePublish(in.payload, &batch));
              im->cluster->ObservePeer(batch.node_id, batch.incarnation);
              im->directory.Apply(batch);
              r.Respond(Status::Ok());
              return Status::Ok();
            });
  ServePeer(cluster, metrics, {kPeerBlockLookup, "block_lookup"}, [im](Incoming& in, Responder& r) {
    std::vector<KeyId> keys;
    KVPOOL_RETURN_IF_ERROR(DecodeLookup(in.payload, &keys));
    RespondEncoded(r, [&](std::vector<uint8_t>* body) {
      EncodeLookupReply(im->directory.Lookup(keys), body);
    });
    return Status::Ok();
  });
  // A fenced home missed publishes: it starts empty, and the holders
  // publish again to its new incarnation.
  cluster->membership()->SubscribeFence([im](bool fenced) {
    if (fenced) im->directory.Clear();
  });
  cluster->membership()->SubscribeViews([im](const std::shared_ptr<const MembershipView>& view) {
    auto after = im->cluster->shard_map();
    auto before = im->last_map;
    im->last_map = after;
    const uint64_t inc = im->cluster->incarnation();
    const bool all = inc != im->last_incarnation;
    im->last_incarnation = inc;
    im->executor->Submit([gate = im->gate, im, before, after, view, all] {
      gate->Run([&] { im->OnView(before, after, view, all); });
    });
  });
}

BlockIndex::~BlockIndex() {
  Stop();
  impl_->gate->Close();
  impl_->metrics->RemoveCallbacks(this);
}

void BlockIndex::Start() {
  std::lock_guard lock(impl_->run_mu);
  if (impl_->running) return;
  impl_->running = true;
  // What the node held before the index existed (nothing at a fresh start;
  // tiers listened to from now on).
  std::vector<KeyId> held;
  impl_->local->ForEachHeld(
      [&](uint64_t hash, blocks::BlockTier tier) { held.push_back(BlockIndexKey(hash, tier)); });
  for (const KeyId& k : held) impl_->publisher.Add(k, 0);
  impl_->flusher = std::thread([im = impl_.get()] { im->Flusher(); });
}

void BlockIndex::Stop() {
  {
    std::lock_guard lock(impl_->run_mu);
    if (!impl_->running) return;
    impl_->running = false;
  }
  impl_->run_cv.notify_all();
  if (impl_->flusher.joinable()) impl_->flusher.join();
}

void BlockIndex::OnBlockTier(uint64_t hash, blocks::BlockTier tier, bool held) {
  const KeyId k = BlockIndexKey(hash, tier);
  if (held) {
    impl_->publisher.Add(k, 0);
  } else {
    impl_->publisher.Remove(k);
  }
  impl_->changes->Inc();
}

uint64_t BlockIndex::entries() const { return impl_->directory.entries(); }

Result<blocks::PrefixAnswer> BlockIndex::Lookup(std::span<const uint64_t> hashes,
                                                std::chrono::milliseconds timeout) {
  Impl* im = impl_.get();
  if (hashes.size() > im->opts.max_hashes) {
    return InvalidArgument(fmt::format("a prefix lookup carries at most {} hashes, not {}",
                                       im->opts.max_hashes, hashes.size()));
  }
  if (im->cluster->fenced()) return NotServing(*im->cluster);
  im->lookups->Inc();
  const auto deadline = transport::SteadyClock::now() + timeout;
  auto view = im->cluster->view();
  auto map = im->cluster->shard_map();
  const size_t n = hashes.size();
  // Index keys: [2i] DRAM, [2i + 1] SSD.
  std::vector<KeyId> keys(2 * n);
  for (size_t i = 0; i < n; ++i) {
    keys[2 * i] = BlockIndexKey(hashes[i], blocks::BlockTier::kDram);
    keys[2 * i + 1] = BlockIndexKey(hashes[i], blocks::BlockTier::kSsd);
  }
  // Grouped by home: the local directory answers this node's keys.
  std::map<std::string, std::vector<size_t>> groups;
  std::vector<size_t> mine;
  uint32_t homeless = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const Member* home = map->HomeOf(keys[j]);
    if (home == nullptr) {
      ++homeless;
    } else if (home->node_id == im->cluster->node_id()) {
      mine.push_back(j);
    } else {
      groups[home->address].push_back(j);
    }
  }
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<LookupResult> results;
    uint32_t inflight = 0;
    uint32_t failed = 0;
  };
  auto st = std::make_shared<Shared>();
  st->results.resize(keys.size());
  if (!mine.empty()) {
    std::vector<KeyId> k;
    for (size_t j : mine) k.push_back(keys[j]);
    auto res = im->directory.Lookup(k);
    for (size_t x = 0; x < mine.size(); ++x) st->results[mine[x]] = std::move(res[x]);
  }
  uint32_t asked = mine.empty() ? 0 : 1;
  bool out_of_time = false;
  for (auto& [address, idx] : groups) {
    for (size_t start = 0; start < idx.size(); start += kMaxPeerBatch) {
      const size_t end = std::min(idx.size(), start + kMaxPeerBatch);
      auto part = std::make_shared<std::vector<size_t>>(idx.begin() + static_cast<ptrdiff_t>(start),
                                                        idx.begin() + static_cast<ptrdiff_t>(end));
      {
        std::unique_lock lock(st->mu);
        if (!st->cv.wait_until(lock, deadline,
                               [&] { return st->inflight < im->opts.max_fanout; })) {
          out_of_time = true;
        }
        if (out_of_time) {
          ++st->failed;  // never asked: its keys count as held nowhere
          continue;
        }
        ++st->inflight;
      }
      ++asked;
      std::vector<KeyId> k;
      for (size_t j : *part) k.push_back(keys[j]);
      auto payload = std::make_shared<std::vector<uint8_t>>();
      EncodeLookup(k, payload.get());
      transport::CallArgs args;
      args.peer = address;
      args.type = kPeerBlockLookup;
      args.payload = *payload;
      args.deadline = deadline;
      im->cluster->transport()->Call(args, [st, part, payload](transport::Reply r) {
        std::vector<LookupResult> res;
        Status s = r.status;
        if (s.ok()) s = DecodeLookupReply(r.payload, part->size(), &res);
        std::lock_guard lock(st->mu);
        if (s.ok()) {
          for (size_t x = 0; x < part->size(); ++x) st->results[(*part)[x]] = std::move(res[x]);
        } else {
          ++st->failed;
        }
        --st->inflight;
        st->cv.notify_all();
      });
    }
  }
  std::vector<LookupResult> results;
  uint32_t failed;
  {
    std::unique_lock lock(st->mu);
    if (!st->cv.wait_until(lock, deadline, [&] { return st->inflight == 0; })) {
      failed = st->failed + st->inflight;  // late: their answers are not waited for
    } else {
      failed = st->failed;
    }
    results = st->results;  // a late answer writes into st, not here
  }
  im->home_failures->Inc(failed + homeless);
  // Per live holder, its tiers of each block.
  std::map<std::string, std::vector<uint8_t>> tiers;
  for (size_t j = 0; j < results.size(); ++j) {
    const uint8_t bit = j % 2 == 0 ? blocks::kTierDram : blocks::kTierSsd;
    for (const HolderRef& h : results[j].holders) {
      const Member* m = view->Find(h.node_id);
      if (m == nullptr || (m->incarnation != 0 && m->incarnation != h.incarnation)) continue;
      auto& t = tiers[h.node_id];
      if (t.empty()) t.assign(n, 0);
      t[j / 2] |= bit;
    }
  }
  std::vector<std::pair<blocks::PrefixHolder, std::vector<uint8_t>>> nodes;
  for (auto& [node, t] : tiers) {
    blocks::PrefixHolder h;
    h.node_id = node;
    h.address = view->Find(node)->address;
    nodes.emplace_back(std::move(h), std::move(t));
  }
  blocks::PrefixAnswer a = blocks::BuildPrefixAnswer(static_cast<uint32_t>(n), std::move(nodes));
  a.homes = asked + homeless;
  a.homes_failed = failed + homeless;
  return a;
}

}  // namespace kvpool::cluster
