#include "cluster/home_placer.h"

#include <memory>

#include "cluster/peer_messages_format.h"
#include "common/log.h"

namespace kvpool::cluster {

HomePlacer::HomePlacer(const HomePlacerOptions& options, Cluster* cluster, Publisher* publisher,
                       TieredStore* store, MetricsRegistry* m)
    : cluster_(cluster), publisher_(publisher), store_(store), opts_(options), metrics_(m) {
  moved_ = m->GetCounter("kvpool_placement_moved_total",
                         "Values handed to their home node (placement home)");
  kept_ = m->GetCounter("kvpool_placement_kept_total",
                        "Values kept here because their home could not take them");
  busy_ = m->GetCounter("kvpool_placement_busy_total",
                        "Values kept here because the hand-offs in flight were at their byte budget");
  m->AddCallbackGauge("kvpool_placement_inflight_bytes", "Value bytes being handed to homes", {},
                      [this] { return static_cast<double>(inflight_bytes_.load()); }, this);
}

HomePlacer::~HomePlacer() { metrics_->RemoveCallbacks(this); }

void HomePlacer::Place(const KeyId& key, uint64_t size) {
  const Member* home = cluster_->shard_map()->HomeOf(key);
  if (home == nullptr || home->node_id == cluster_->node_id() || cluster_->fenced()) {
    publisher_->Add(key, size);
    return;
  }
  // Reserve the bytes first; over budget (unless nothing is in flight),
  // the value stays here.
  uint64_t before = inflight_bytes_.fetch_add(size);
  if (before != 0 && before + size > opts_.max_inflight_bytes) {
    inflight_bytes_.fetch_sub(size);
    busy_->Inc();
    publisher_->Add(key, size);
    return;
  }
  auto pin = store_->Acquire(key);
  if (!pin.ok()) {  // already gone (evicted or removed)
    inflight_bytes_.fetch_sub(size);
    return;
  }
  auto held = std::make_shared<DramStore::Pin>(std::move(pin).value());
  std::vector<uint8_t> request;
  EncodeStore(key, size, &request);
  transport::CallArgs args;
  args.peer = home->address;
  args.type = kPeerStore;
  args.request = request;
  args.payload = {store_->dram()->segment_base() + held->offset(), held->size()};
  args.deadline = transport::Clock::now() + opts_.timeout;
  std::string peer = home->address;
  cluster_->transport()->Call(args, [this, held, key, size, peer](transport::Reply r) {
    held->Reset();
    inflight_bytes_.fetch_sub(size);
    if (r.status.ok()) {
      moved_->Inc();
      Status s = store_->Remove(key);  // the home holds it (and publishes it)
      (void)s;
      return;
    }
    kept_->Inc();
    LogDebug("store {} at home {}: {}", key.ToHex(), peer, r.status.ToString());
    publisher_->Add(key, size);
  });
}

}  // namespace kvpool::cluster
