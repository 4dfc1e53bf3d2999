#include "cluster/publisher.h"

#include <map>

#include "common/log.h"

namespace kvpool::cluster {

Publisher::Publisher(const PublisherOptions& options, Cluster* cluster, Directory* directory,
                     Executor* executor, MetricsRegistry* m, const Clock* clock)
    : opts_(options), cluster_(cluster), directory_(directory), executor_(executor), clock_(clock) {
  sent_ = m->GetCounter("kvpool_publish_items_total", "Directory items published to home nodes");
  dropped_ = m->GetCounter("kvpool_publish_dropped_total",
                           "Directory items dropped (queue full, no home, or out of retries)");
  errors_ = m->GetCounter("kvpool_peer_errors_total", "Failed peer calls, by operation",
                          {{"op", "publish"}});
  queued_adds_ = m->GetCounter("kvpool_publish_queued_total",
                               "Directory items queued for publishing, by operation",
                               {{"op", "add"}});
  queued_removes_ = m->GetCounter("kvpool_publish_queued_total",
                                  "Directory items queued for publishing, by operation",
                                  {{"op", "remove"}});
  retried_ = m->GetCounter("kvpool_publish_retried_total",
                           "Directory items sent again after a home did not take their batch");
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
    (item.op == PublishOp::kAdd ? queued_adds_ : queued_removes_)->Inc();
    if (queue_.size() >= opts_.max_batch && !flush_scheduled_) {
      flush_scheduled_ = true;
      schedule = true;
    }
  }
  if (schedule) executor_->Submit([this] { Flush(); });
}

size_t Publisher::queued() {
  std::lock_guard lock(mu_);
  return queue_.size();
}

size_t Publisher::retrying() {
  std::lock_guard lock(retry_->mu);
  return retry_->items.size();
}

bool Publisher::WaitBelow(size_t n, std::chrono::milliseconds max) {
  std::unique_lock lock(mu_);
  return drained_.wait_for(lock, max, [&] { return queue_.size() < n; });
}

void Publisher::Flush() {
  std::lock_guard flush_lock(flush_mu_);
  FlushLocked();
}

bool Publisher::FlushIfQuick(size_t max_items) {
  std::unique_lock flush_lock(flush_mu_, std::try_to_lock);
  if (!flush_lock.owns_lock()) return false;
  {
    std::lock_guard lock(mu_);
    if (queue_.size() > max_items) return false;
  }
  FlushLocked();
  return true;
}

void Publisher::FlushLocked() {
  std::vector<PublishItem> fresh;
  {
    std::lock_guard lock(mu_);
    fresh.swap(queue_);
    flush_scheduled_ = false;
  }
  drained_.notify_all();
  // Retries that are due go first (they are older).
  std::vector<Retry> items;
  {
    auto now = clock_->Now();
    std::lock_guard lock(retry_->mu);
    while (!retry_->items.empty() && retry_->items.front().due <= now) {
      items.push_back(retry_->items.front());
      retry_->items.pop_front();
    }
  }
  if (!items.empty()) retried_->Inc(items.size());
  items.reserve(items.size() + fresh.size());
  for (const PublishItem& it : fresh) items.push_back({it, 0, {}});
  if (items.empty()) return;
  auto map = cluster_->shard_map();
  const std::string& self = cluster_->node_id();
  uint64_t incarnation = cluster_->incarnation();
  // Per home address: its items (the home's node id decides "is it me").
  std::map<std::string, std::vector<Retry>> batches;
  PublishBatch local{self, incarnation, {}};
  for (const Retry& r : items) {
    const Member* home = map->HomeOf(r.item.key);
    if (home == nullptr) {
      dropped_->Inc();
      continue;
    }
    if (home->node_id == self) {
      local.items.push_back(r.item);
      continue;
    }
    batches[home->address].push_back(r);
  }
  if (!local.items.empty()) {
    directory_->Apply(local);
    sent_->Inc(local.items.size());
  }
  if (cluster_->fenced()) {
    // A fenced node publishes nothing; it replays everything it holds
    // when it registers again.
    dropped_->Inc(items.size() - local.items.size());
    return;
  }
  for (auto& [address, batch] : batches) {
    for (size_t start = 0; start < batch.size(); start += opts_.max_batch) {
      size_t end = std::min(batch.size(), start + opts_.max_batch);
      auto part = std::make_shared<std::vector<Retry>>(
          batch.begin() + static_cast<ptrdiff_t>(start), batch.begin() + static_cast<ptrdiff_t>(end));
      PublishBatch msg{self, incarnation, {}};
      msg.items.reserve(part->size());
      for (const Retry& r : *part) msg.items.push_back(r.item);
      auto payload = std::make_shared<std::vector<uint8_t>>();
      EncodePublish(msg, payload.get());
      std::vector<uint8_t> scope;  // copied by Call
      EncodeTenantScope(opts_.tenant, {}, &scope);
      transport::CallArgs args;
      args.peer = address;
      args.type = opts_.tenant.empty() ? opts_.type : ScopedType(kPeerPublish, opts_.tenant);
      args.request = scope;
      args.payload = *payload;
      args.deadline = transport::SteadyClock::now() + opts_.timeout;
      // The callback may outlive the publisher: it touches only metrics and
      // the shared retry queue.
      Counter* sent = sent_;
      Counter* errors = errors_;
      Counter* dropped = dropped_;
      auto retry = retry_;
      const PublisherOptions opts = opts_;
      const Clock* clock = clock_;
      cluster_->transport()->Call(args, [sent, errors, dropped, payload, part, retry, opts, clock,
                                         address](transport::Reply r) {
        if (r.status.ok()) {
          sent->Inc(part->size());
          return;
        }
        errors->Inc();
        LogDebug("publish to {}: {}", address, r.status.ToString());
        auto due = clock->Now() + opts.retry_delay;
        std::lock_guard lock(retry->mu);
        for (Retry& it : *part) {
          if (it.attempt >= opts.max_retries || retry->items.size() >= opts.max_queue) {
            dropped->Inc();
            continue;
          }
          retry->items.push_back({it.item, it.attempt + 1, due});
        }
      });
    }
  }
}

}  // namespace kvpool::cluster
