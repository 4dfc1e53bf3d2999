#include "cluster/home_placer.h"

#include <cstring>
#include <memory>

#include "common/log.h"
#include "peer/peer_messages_format.h"

namespace kvpool::cluster {

HomePlacer::HomePlacer(const HomePlacerOptions& options, Cluster* cluster, TieredStore* store,
                       KeptFn kept, MetricsRegistry* m)
    : cluster_(cluster), kept_fn_(std::move(kept)), store_(store), opts_(options), metrics_(m) {
  moved_ = m->GetCounter("kvpool_placement_moved_total",
                         "Values handed to their home node (placement home)");
  kept_ = m->GetCounter("kvpool_placement_kept_total",
                        "Values kept here because their home could not take them");
  busy_ = m->GetCounter("kvpool_placement_busy_total",
                        "Values queued because the hand-offs in flight were at their byte budget");
  queue_full_ = m->GetCounter("kvpool_placement_queue_full_total",
                              "Values kept here because the hand-off queue was full");
  overfed_ = m->GetCounter("kvpool_placement_chain_overfed_total",
                           "Chain continuations sent to the member fed least because the chain's "
                           "node was fed over 1.25 times its share (placement chain)");
  forwarded_ = m->GetCounter("kvpool_placement_forwarded_total",
                             "Puts sent to their chain's home without being stored here first "
                             "(placement chain; also counted as moved or kept)");
  forward_dropped_ = m->GetCounter(
      "kvpool_placement_forward_dropped_total",
      "Forwarded puts their target refused, dropped because the SSD tier could make the writer "
      "wait (placement chain)");
  notes_dropped_ = m->GetCounter("kvpool_placement_chain_notes_dropped_total",
                                 "Chain notes dropped unused because too many were waiting "
                                 "(placement chain)");
  m->AddCallbackGauge("kvpool_placement_inflight_bytes", "Value bytes being handed to homes", {},
                      [this] { return static_cast<double>(inflight_bytes_.load()); }, this);
  m->AddCallbackGauge("kvpool_placement_queued", "Values waiting to be handed to their homes", {},
                      [this] {
                        std::lock_guard lock(mu_);
                        return static_cast<double>(queue_.size());
                      },
                      this);
}

HomePlacer::~HomePlacer() { metrics_->RemoveCallbacks(this); }

std::string HomePlacer::PickForNewChain(size_t n) {
  auto view = cluster_->view();
  const std::string& self = cluster_->node_id();
  std::string best_id = self, best_address;
  uint64_t best = fed_[self];
  for (const Member& m : view->members) {
    if (m.node_id == self || m.state != MemberState::kAlive || m.weight <= 0) continue;
    const uint64_t fed = fed_[m.node_id];
    if (fed < best) {
      best = fed;
      best_id = m.node_id;
      best_address = m.address;
    }
  }
  fed_[best_id] += n;
  return best_address;
}

void HomePlacer::NoteChain(std::span<const KeyId> keys, const KeyId* before,
                           const std::optional<std::string>& before_at,
                           const std::vector<bool>& returning) {
  if (!opts_.by_chain || keys.empty()) return;
  std::lock_guard lock(mu_);
  if (chain_notes_.size() + keys.size() > opts_.max_chain_notes) {
    notes_dropped_->Inc(chain_notes_.size());
    chain_notes_.clear();
  }
  // The chain goes on where its previous block is, unless that member has
  // been fed far more than its share: chains that share a long prefix (one
  // system prompt) would otherwise all grow on the prefix's node. Then, as
  // a new chain does, to the member fed least.
  std::string address;
  bool placed = false;
  if (before_at) {
    std::string id = cluster_->node_id();
    uint64_t total = 0, members = 0;
    auto view = cluster_->view();
    for (const Member& m : view->members) {
      if (!before_at->empty() && m.address == *before_at) id = m.node_id;
      if (m.state == MemberState::kAlive && m.weight > 0) {
        total += fed_[m.node_id];
        ++members;
      }
    }
    const uint64_t fair = members == 0 ? 0 : total / members;
    if (fed_[id] <= fair + fair / 4 + kFedSlack) {
      address = *before_at;
      fed_[id] += keys.size();
      placed = true;
    } else {
      overfed_->Inc();
    }
  }
  if (!placed) address = PickForNewChain(keys.size());
  // Counts decay: what was placed long ago says little about the load now.
  fed_total_ += keys.size();
  if (fed_total_ > kFedHalfLife) {
    for (auto& [id, n] : fed_) n /= 2;
    std::erase_if(fed_, [](const auto& kv) { return kv.second == 0; });  // members long gone
    fed_total_ /= 2;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    Target& t = chain_notes_[keys[i]];
    t.route = keys[i];
    t.address = address;
    if (i > 0) t.after = keys[i - 1];
    else if (before != nullptr) t.after = *before;
    else t.after.reset();
    t.returning = i < returning.size() && returning[i];
  }
}

std::string HomePlacer::AddressOf(const Target& target) const {
  if (cluster_->fenced()) return "";
  if (opts_.by_chain) return target.address;
  const Member* home = cluster_->shard_map()->HomeOf(target.route);
  if (home == nullptr || home->node_id == cluster_->node_id()) return "";
  return home->address;
}

std::string HomePlacer::ForwardTarget(const KeyId& key, Target* target) {
  if (!opts_.by_chain || stopped_.load()) return "";
  {
    std::lock_guard lock(mu_);
    auto it = chain_notes_.find(key);
    if (it == chain_notes_.end()) return "";
    *target = it->second;
  }
  return AddressOf(*target);
}

bool HomePlacer::WouldForward(const KeyId& key) {
  Target target;
  return !ForwardTarget(key, &target).empty();
}

bool HomePlacer::Forward(const KeyId& key, std::span<const uint8_t> value) {
  Target target;
  const std::string address = ForwardTarget(key, &target);
  if (address.empty()) return false;
  const uint64_t size = value.size();
  if (!TakeBudget(size)) return false;
  {
    std::lock_guard lock(mu_);
    chain_notes_.erase(key);
  }
  forwarded_->Inc();
  auto copy = std::make_shared<std::vector<uint8_t>>(value.begin(), value.end());
  Send(address, key, target, *copy, [this, copy, key, size, peer = address](transport::Reply r) {
    inflight_bytes_.fetch_sub(size);
    if (r.status.ok()) {
      moved_->Inc();
    } else {
      LogDebug("store {} at chain home {}: {}", key.ToHex(), peer, r.status.ToString());
      // Stored here after all (its commit is placed here: no note left).
      // With an SSD tier a Reserve may wait for SSD room, which a transport
      // thread must not: the value is dropped (a miss later, never wrong).
      if (store_->has_ssd_tier()) {
        forward_dropped_->Inc();
        Drain();
        return;
      }
      kept_->Inc();
      auto slot = store_->Reserve(key, size);
      if (slot.ok()) {
        std::memcpy(slot->data(), copy->data(), size);
        Status s = store_->Commit(std::move(slot).value(), WriteOrigin::kPut);
        (void)s;
      }
    }
    Drain();
  });
  return true;
}

bool HomePlacer::TakeBudget(uint64_t size) {
  // Over budget (unless nothing is in flight): no.
  const uint64_t before = inflight_bytes_.fetch_add(size);
  if (before != 0 && before + size > opts_.max_inflight_bytes) {
    inflight_bytes_.fetch_sub(size);
    return false;
  }
  return true;
}

void HomePlacer::Send(const std::string& address, const KeyId& key, const Target& target,
                      std::span<const uint8_t> value, transport::ReplyCallback done) {
  std::vector<uint8_t> request;
  EncodeStore(key, value.size(), target.after ? &*target.after : nullptr,
              target.returning ? kStoreReturning : 0, &request);
  std::vector<uint8_t> header;
  EncodeTenantScope(opts_.tenant, request, &header);
  transport::CallArgs args;
  args.peer = address;
  args.type = ScopedType(kPeerStore, opts_.tenant);
  args.request = header;
  args.payload = value;
  args.deadline = transport::SteadyClock::now() + opts_.timeout;
  cluster_->transport()->Call(args, std::move(done));
}

HomePlacer::Placement HomePlacer::Place(const KeyId& key, uint64_t size) {
  Target target{key, "", std::nullopt};
  if (opts_.by_chain) {
    std::lock_guard lock(mu_);
    auto it = chain_notes_.find(key);
    if (it == chain_notes_.end()) return Placement::kHere;
    target = it->second;
    chain_notes_.erase(it);
  }
  switch (TryStart(key, target, size, /*announced=*/false)) {
    case Start::kStarted: return Placement::kHandingOff;
    case Start::kHere: return Placement::kHere;
    case Start::kBusy: break;
  }
  // Over budget: readable from here at once, moved later.
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= opts_.max_queued) {
      queue_full_->Inc();
      return Placement::kHere;
    }
    queue_.push_back({key, size, target});
  }
  busy_->Inc();
  Drain();  // the hand-offs in flight may all have finished meanwhile
  return Placement::kQueued;
}

void HomePlacer::Drain() {
  while (!stopped_.load()) {
    Queued q;
    {
      std::lock_guard lock(mu_);
      if (queue_.empty()) return;
      q = queue_.front();
      queue_.pop_front();
    }
    const Start started = TryStart(q.key, q.target, q.size, /*announced=*/true);
    if (started == Start::kBusy) {
      std::lock_guard lock(mu_);
      queue_.push_front(q);
      return;
    }
    if (started == Start::kHere) kept_fn_(q.key, q.size, /*announced=*/true);
  }
}

HomePlacer::Start HomePlacer::TryStart(const KeyId& key, const Target& target, uint64_t size,
                                        bool announced) {
  if (stopped_.load()) return Start::kHere;
  const std::string address = AddressOf(target);
  if (address.empty()) return Start::kHere;
  if (!TakeBudget(size)) return Start::kBusy;
  auto pin = store_->Acquire(key);
  if (!pin.ok()) {  // already gone (evicted or removed)
    inflight_bytes_.fetch_sub(size);
    return Start::kStarted;
  }
  auto held = std::make_shared<TieredStore::Pin>(std::move(pin).value());
  Send(address, key, target, held->bytes(),
       [this, held, key, size, peer = address, announced](transport::Reply r) {
    held->Reset();
    inflight_bytes_.fetch_sub(size);
    if (r.status.ok()) {
      moved_->Inc();
      // The home holds it (and publishes it); this node no longer does.
      Status s = store_->Remove(key, HoldingsEvent::Why::kHandedOff);
      (void)s;
    } else {
      kept_->Inc();
      LogDebug("store {} at home {}: {}", key.ToHex(), peer, r.status.ToString());
      kept_fn_(key, size, announced);
    }
    Drain();
  });
  return Start::kStarted;
}

}  // namespace kvpool::cluster
