#include "cluster/publisher.h"

#include <map>

#include "common/log.h"

namespace kvpool::cluster {

Publisher::Publisher(const PublisherOptions& options, Cluster* cluster, Directory* directory,
                     Executor* executor, MetricsRegistry* m)
    : opts_(options), cluster_(cluster), directory_(directory), executor_(executor) {
  sent_ = m->GetCounter("kvpool_publish_items_total", "Directory items published to home nodes");
  dropped_ = m->GetCounter("kvpool_publish_dropped_total",
                           "Directory items dropped (queue full or no home)");
  errors_ = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                          {{"op", "publish"}});
}

void Publisher::Add(const KeyId& key, uint64_t size) { Enqueue({key, PublishOp::kAdd, size}); }
void Publisher::Remove(const KeyId& key) { Enqueue({key, PublishOp::kRemove, 0}); }

void Publisher::Enqueue(const PublishItem& item) {
  bool schedule = false;
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= opts_.max_queue) {
      dropped_->Inc();
      return;
    }
    queue_.push_back(item);
    if (queue_.size() >= opts_.max_batch && !flush_scheduled_) {
      flush_scheduled_ = true;
      schedule = true;
    }
  }
  if (schedule) executor_->Submit([this] { Flush(); });
}

void Publisher::Flush() {
  std::lock_guard flush_lock(flush_mu_);
  std::vector<PublishItem> items;
  {
    std::lock_guard lock(mu_);
    items.swap(queue_);
    flush_scheduled_ = false;
  }
  if (items.empty()) return;
  auto map = cluster_->shard_map();
  const std::string& self = cluster_->node_id();
  uint64_t incarnation = cluster_->incarnation();
  // Per home address: its batch (the home's node id decides "is it me").
  std::map<std::string, PublishBatch> batches;
  PublishBatch local{self, incarnation, {}};
  for (const auto& it : items) {
    const Member* home = map->HomeOf(it.key);
    if (home == nullptr) {
      dropped_->Inc();
      continue;
    }
    if (home->node_id == self) {
      local.items.push_back(it);
      continue;
    }
    PublishBatch& b = batches[home->address];
    if (b.items.empty()) b = PublishBatch{self, incarnation, {}};
    b.items.push_back(it);
  }
  if (!local.items.empty()) {
    directory_->Apply(local);
    sent_->Inc(local.items.size());
  }
  if (cluster_->fenced()) {
    dropped_->Inc(items.size() - local.items.size());
    return;
  }
  for (auto& [address, batch] : batches) {
    for (size_t start = 0; start < batch.items.size(); start += opts_.max_batch) {
      PublishBatch part{batch.node_id, batch.incarnation, {}};
      size_t end = std::min(batch.items.size(), start + opts_.max_batch);
      part.items.assign(batch.items.begin() + static_cast<ptrdiff_t>(start),
                        batch.items.begin() + static_cast<ptrdiff_t>(end));
      auto payload = std::make_shared<std::vector<uint8_t>>();
      EncodePublish(part, payload.get());
      transport::CallArgs args;
      args.peer = address;
      args.type = kPeerPublish;
      args.payload = *payload;
      args.deadline = transport::Clock::now() + opts_.timeout;
      size_t n = part.items.size();
      // The callback may outlive the publisher: it touches only metrics.
      Counter* sent = sent_;
      Counter* errors = errors_;
      Counter* dropped = dropped_;
      cluster_->transport()->Call(args, [sent, errors, dropped, payload, n,
                                         address](transport::Reply r) {
        if (r.status.ok()) {
          sent->Inc(n);
        } else {
          errors->Inc();
          dropped->Inc(n);
          LogDebug("publish to {}: {}", address, r.status.ToString());
        }
      });
    }
  }
}

}  // namespace kvpool::cluster
