#include "cluster/home_placer.h"

#include <memory>

#include "cluster/peer_messages_format.h"
#include "common/log.h"

namespace kvpool::cluster {

HomePlacer::HomePlacer(Cluster* cluster, Publisher* publisher, TieredStore* store,
                       std::chrono::milliseconds timeout, MetricsRegistry* m)
    : cluster_(cluster), publisher_(publisher), store_(store), timeout_(timeout) {
  moved_ = m->GetCounter("kvpool_placement_moved_total",
                         "Values handed to their home node (placement home)");
  kept_ = m->GetCounter("kvpool_placement_kept_total",
                        "Values kept here because their home could not take them");
}

void HomePlacer::Place(const KeyId& key, uint64_t size) {
  const Member* home = cluster_->shard_map()->HomeOf(key);
  if (home == nullptr || home->node_id == cluster_->node_id() || cluster_->fenced()) {
    publisher_->Add(key, size);
    return;
  }
  auto pin = store_->Acquire(key);
  if (!pin.ok()) return;  // already gone (evicted or removed)
  auto held = std::make_shared<DramStore::Pin>(std::move(pin).value());
  std::vector<uint8_t> request;
  EncodeStore(key, size, &request);
  transport::CallArgs args;
  args.peer = home->address;
  args.type = kPeerStore;
  args.request = request;
  args.payload = {store_->dram()->segment_base() + held->offset(), held->size()};
  args.deadline = transport::Clock::now() + timeout_;
  std::string peer = home->address;
  cluster_->transport()->Call(args, [this, held, key, size, peer](transport::Reply r) {
    held->Reset();
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
