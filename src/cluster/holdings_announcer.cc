#include "cluster/holdings_announcer.h"

namespace kvpool::cluster {

HoldingsAnnouncer::HoldingsAnnouncer(const HoldingsAnnouncerOptions& options, Cluster* cluster,
                                     Directory* local_directory, TieredStore* store,
                                     Executor* executor, MetricsRegistry* metrics,
                                     const Clock* clock)
    : opts_(options),
      store_(store),
      executor_(executor),
      publisher_(options.publish, cluster, local_directory, executor, metrics, clock) {
  if (opts_.placement) {
    placer_ = std::make_unique<HomePlacer>(
        *opts_.placement, cluster, store,
        [this](const KeyId& key, uint64_t size, bool announced) { OnKept(key, size, announced); },
        metrics);
  }
  ssd_unpublished_ = metrics->GetCounter(
      "kvpool_publish_ssd_dropped_total",
      "Entries unpublished because the SSD tier dropped them (region reclaimed or lost) and DRAM "
      "does not hold them");
}

HoldingsAnnouncer::~HoldingsAnnouncer() { Stop(); }

void HoldingsAnnouncer::Start() {
  {
    std::lock_guard lock(run_mu_);
    if (running_) return;
    running_ = true;
  }
  store_->SetHoldingsObserver(this);
  if (opts_.publish_interval.count() <= 0) return;
  scheduler_ = opts_.scheduler;
  if (scheduler_ == nullptr) {
    own_scheduler_ = std::make_unique<ThreadScheduler>("kvpool-publish");
    scheduler_ = own_scheduler_.get();
  }
  flush_job_ = scheduler_->RunEvery(
      opts_.publish_interval, [this] { publisher_.Flush(); }, opts_.publish_interval);
}

void HoldingsAnnouncer::Stop() {
  if (placer_ != nullptr) placer_->Stop();  // before the transport fails its hand-offs
  {
    std::lock_guard lock(run_mu_);
    if (!running_) return;
    running_ = false;
  }
  if (flush_job_ != 0) scheduler_->Cancel(flush_job_);  // waits for a running flush
  flush_job_ = 0;
  own_scheduler_.reset();
  store_->SetHoldingsObserver(nullptr);  // waits for a running OnHoldings
}

void HoldingsAnnouncer::OnHoldings(const HoldingsEvent& e) {
  using W = HoldingsEvent::Why;
  if (e.kind == HoldingsEvent::Kind::kStored) {
    if (e.why != W::kWritten) return;  // a promotion: held already
    switch (e.origin) {
      case WriteOrigin::kCopy:
        publisher_.Add(e.key, e.size);
        return;
      case WriteOrigin::kPlaced:
        // Flush applies this node's own items synchronously, in queue order.
        publisher_.Add(e.key, e.size);
        publisher_.Flush();
        return;
      case WriteOrigin::kPut:
        break;
    }
    if (placer_ == nullptr) {
      publisher_.Add(e.key, e.size);
      return;
    }
    switch (placer_->Place(e.key, e.size)) {
      case HomePlacer::Placement::kHandingOff:
        return;
      case HomePlacer::Placement::kQueued: {
        std::lock_guard lock(pending_mu_);
        announced_pending_.insert(e.key);
        break;
      }
      case HomePlacer::Placement::kHere:
        break;
    }
    publisher_.Add(e.key, e.size);
    return;
  }
  if (!e.leaves_node()) return;
  if (placer_ != nullptr) {
    bool was_pending;
    {
      std::lock_guard lock(pending_mu_);
      was_pending = announced_pending_.erase(e.key) > 0;
    }
    // Handed off before it was announced: the home publishes it, nothing here.
    if (e.why == W::kHandedOff && !was_pending) return;
  }
  if (e.tier == HoldingTier::kSsd && e.why != W::kRemoved) ssd_unpublished_->Inc();
  publisher_.Remove(e.key);
}

void HoldingsAnnouncer::FlushNow() {
  if (publisher_.FlushIfQuick(4 * size_t{opts_.publish.max_batch})) return;
  executor_->Submit([this] { publisher_.Flush(); });
}

HoldingsAnnouncer::Republished HoldingsAnnouncer::Republish(
    const std::vector<bool>& shards, const std::function<bool()>& cancelled) {
  // Well under the publisher's bound (PublisherOptions::max_queue).
  constexpr size_t kMaxBacklog = 64 * 1024;
  Republished sent;
  store_->ListHeld(
      [&](uint64_t key_hi) {
        return shards[ShardOf(KeyId{key_hi, 0})];
      },
      [&](const KeyId& key, uint64_t size, HoldingTier tier) {
        publisher_.Add(key, size);
        ++(tier == HoldingTier::kSsd ? sent.ssd : sent.dram);
        if ((sent.dram + sent.ssd) % 1024 == 0) {
          // Woken by each flush; cancelled() asked between.
          while (!publisher_.WaitBelow(kMaxBacklog, std::chrono::milliseconds(50))) {
            if (cancelled()) return false;
          }
        }
        return !cancelled();
      });
  return sent;
}

void HoldingsAnnouncer::OnKept(const KeyId& key, uint64_t size, bool announced) {
  if (announced) {
    std::lock_guard lock(pending_mu_);
    announced_pending_.erase(key);
    return;
  }
  publisher_.Add(key, size);
}

}  // namespace kvpool::cluster
