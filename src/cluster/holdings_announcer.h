// HoldingsAnnouncer: tells the keys' home nodes what this node holds. It is
// the one consumer of the store's holdings stream (store/holdings.h) in the
// cluster and the one owner of publish work: stored/dropped events become
// Publish items in OnHoldings, inventory re-sends (a membership change's
// replay, anti-entropy's repairs) go through Relist/Unlist, and a placement
// home's hand-offs are decided here with the HomePlacer it owns. It owns the
// publish schedule: the queue is flushed every publish_interval.
//
// What an event becomes:
//   kWritten, origin kPut     placement local: Add. Placement home: the
//                             placer hands it to its home (Add only if it
//                             stays here, or at once when it must wait).
//   kWritten, origin kCopy    Add (a replica read from another node).
//   kWritten, origin kPlaced  Add, and the queue is flushed before the
//                             commit returns: the writer drops its copy on
//                             this node's answer.
//   kPromoted                 nothing (the node held it already).
//   dropped, still held       nothing (kMovedToSsd; an SSD copy reclaimed
//                             while DRAM has the key).
//   dropped, kHandedOff       Remove, when it had been announced.
//   dropped, other            Remove.
//
// Thread-safe. OnHoldings may run under the DRAM tier's lock (evictions):
// it takes only this object's and the Publisher's mutexes there.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/home_placer.h"
#include "cluster/publisher.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "common/scheduler.h"
#include "store/holdings.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct HoldingsAnnouncerOptions {
  PublisherOptions publish;
  // How often the queue goes out: shorter makes a new value findable from
  // other nodes sooner, at more (smaller) batches. 0: only when Flush is
  // called (tests).
  std::chrono::milliseconds publish_interval{5};
  // Placement home: values put here are handed to their home nodes.
  // Absent: placement local (a value stays where it was put).
  std::optional<HomePlacerOptions> placement;
  // Where the flushes run (null: a scheduler thread of the announcer's
  // own). Must outlive the announcer.
  Scheduler* scheduler = nullptr;
};

class HoldingsAnnouncer final : public HoldingsObserver {
 public:
  // All pointers must outlive the announcer; the cluster's transport must
  // be stopped before it is destroyed (the placer's callbacks use it).
  // clock: when publish retries are due (Publisher).
  HoldingsAnnouncer(const HoldingsAnnouncerOptions& options, Cluster* cluster,
                    Directory* local_directory, TieredStore* store, Executor* executor,
                    MetricsRegistry* metrics, const Clock* clock = SystemClock::Get());
  ~HoldingsAnnouncer() override;
  HoldingsAnnouncer(const HoldingsAnnouncer&) = delete;
  HoldingsAnnouncer& operator=(const HoldingsAnnouncer&) = delete;

  // Observes the store and starts the publish schedule.
  void Start();
  // Stops observing the store and the schedule (what is queued is not
  // sent). Idempotent; called by the destructor.
  void Stop();

  // The holdings stream (see the table above).
  void OnHoldings(const HoldingsEvent& event) override;

  // The placer of placement home and chain (chain notes go to it); null for
  // placement local.
  HomePlacer* placer() const { return placer_.get(); }

  // Inventory re-sends: the key is (still / no longer) held here.
  void Relist(const KeyId& key, uint64_t size) { publisher_.Add(key, size); }
  void Unlist(const KeyId& key) { publisher_.Remove(key); }
  // What a re-announcement sent.
  struct Republished {
    uint64_t dram = 0;
    uint64_t ssd = 0;  // held only on SSD
  };
  // Re-announces every key of the store in the shards marked in `shards`
  // (TieredStore::ListHeld; all of them: start, re-registration; some: a
  // view that moved their homes). Keeps the queue under a bound, waiting
  // for the flushes (so blocks for as long as the inventory takes to
  // send); stops early when cancelled() turns true. Call it on a thread
  // that may wait, not a peer handler's.
  Republished Republish(const std::vector<bool>& shards, const std::function<bool()>& cancelled);
  // Items waiting for the next flush.
  size_t queued() { return publisher_.queued(); }
  // Sends the queue now (the schedule does it every publish_interval).
  void Flush() { publisher_.Flush(); }
  // Sends the queue now on this thread when that is quick (no flush
  // running, a few batches queued), else soon on the executor: for a
  // caller that must not wait (a put's PublishNow, on the local loop).
  void FlushNow();

 private:
  void OnKept(const KeyId& key, uint64_t size, bool announced);

  const HoldingsAnnouncerOptions opts_;
  TieredStore* const store_;
  Executor* const executor_;
  Publisher publisher_;
  std::unique_ptr<HomePlacer> placer_;  // placement home and chain only
  Counter* ssd_unpublished_;

  // Placement home: keys announced while waiting for their hand-off.
  std::mutex pending_mu_;
  std::unordered_set<KeyId, KeyIdHash> announced_pending_;  // protected by pending_mu_

  std::mutex run_mu_;
  bool running_ = false;  // protected by run_mu_
  std::unique_ptr<ThreadScheduler> own_scheduler_;  // when opts_.scheduler is null
  Scheduler* scheduler_ = nullptr;
  Scheduler::JobId flush_job_ = 0;
};

}  // namespace kvpool::cluster
