#include "cluster/home_placer.h"

#include <memory>

#include "cluster/peer_messages_format.h"
#include "common/log.h"

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

HomePlacer::Placement HomePlacer::Place(const KeyId& key, uint64_t size) {
  switch (TryStart(key, size, /*announced=*/false)) {
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
    queue_.push_back({key, size});
  }
  busy_->Inc();
  Drain();  // the hand-offs in flight may all have finished meanwhile
  return Placement::kQueued;
}

void HomePlacer::Drain() {
  for (;;) {
    Queued q;
    {
      std::lock_guard lock(mu_);
      if (queue_.empty()) return;
      q = queue_.front();
      queue_.pop_front();
    }
    const Start started = TryStart(q.key, q.size, /*announced=*/true);
    if (started == Start::kBusy) {
      std::lock_guard lock(mu_);
      queue_.push_front(q);
      return;
    }
    if (started == Start::kHere) kept_fn_(q.key, q.size, /*announced=*/true);
  }
}

HomePlacer::Start HomePlacer::TryStart(const KeyId& key, uint64_t size, bool announced) {
  const Member* home = cluster_->shard_map()->HomeOf(key);
  if (home == nullptr || home->node_id == cluster_->node_id() || cluster_->fenced()) {
    return Start::kHere;
  }
  // Reserve the bytes first; over budget (unless nothing is in flight): no.
  uint64_t before = inflight_bytes_.fetch_add(size);
  if (before != 0 && before + size > opts_.max_inflight_bytes) {
    inflight_bytes_.fetch_sub(size);
    return Start::kBusy;
  }
  auto pin = store_->Acquire(key);
  if (!pin.ok()) {  // already gone (evicted or removed)
    inflight_bytes_.fetch_sub(size);
    return Start::kStarted;
  }
  auto held = std::make_shared<TieredStore::Pin>(std::move(pin).value());
  std::vector<uint8_t> request;
  EncodeStore(key, size, &request);
  transport::CallArgs args;
  args.peer = home->address;
  args.type = kPeerStore;
  args.request = request;
  args.payload = held->bytes();
  args.deadline = transport::Clock::now() + opts_.timeout;
  std::string peer = home->address;
  cluster_->transport()->Call(args, [this, held, key, size, peer, announced](transport::Reply r) {
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
