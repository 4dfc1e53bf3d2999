// Publisher: tells the keys' home nodes what this node holds. Add/Remove
// queue an item; Flush() sends the queue as one Publish batch per home
// (applied directly when the home is this node). The node calls Flush()
// every few milliseconds; a queue reaching max_batch is flushed at once on
// the executor. Delivery is best effort (soft state) with retries: a batch
// a home did not take (down, fenced while it re-registers, late) is sent
// again up to max_retries times, retry_delay apart, each time to the key's
// home as of then; after that it is counted and dropped. (A retried add can
// land after a later remove of the same key: the home then lists a holder
// that no longer has the key, which costs a reader one failed fetch.)
//
// Thread-safe; Add/Remove are quick (one mutex, no I/O) and may be called
// under the DRAM store's lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "peer/peer_messages_format.h"

namespace kvpool::cluster {

struct PublisherOptions {
  // Items per batch; a full queue is flushed without waiting for the tick.
  uint32_t max_batch = 1024;
  // Queued items at most; beyond it items are dropped (and counted).
  uint32_t max_queue = 1u << 20;
  std::chrono::milliseconds timeout{1000};
  uint32_t max_retries = 5;
  std::chrono::milliseconds retry_delay{200};
  // The tenant whose holdings these are (empty: the default tenant); its
  // batches go as kPeerTenantPublish.
  std::string tenant;
  // The message the batches go as (with no tenant): kPeerPublish for the
  // directory, kPeerBlockPublish for the block index.
  transport::MessageType type = kPeerPublish;
};

class Publisher {
 public:
  // All pointers must outlive the publisher; clock (when retries are due)
  // also its transport callbacks.
  Publisher(const PublisherOptions& options, Cluster* cluster, Directory* local_directory,
            Executor* executor, MetricsRegistry* metrics,
            const Clock* clock = SystemClock::Get());

  void Add(const KeyId& key, uint64_t size);
  void Remove(const KeyId& key);
  void Flush();
  // Flush() on this thread when no flush is running and at most max_items
  // are queued; false (nothing done) otherwise. For a caller that must not
  // wait (the local server's loop).
  bool FlushIfQuick(size_t max_items);
  // Items waiting for the next Flush.
  size_t queued();
  // Items of failed batches waiting to be sent again.
  size_t retrying();
  // Waits until fewer than n items wait for a flush, or `max` passed;
  // true when fewer do. For a producer of a large inventory, which must not
  // outrun the flushes (max_queue drops what is beyond it).
  bool WaitBelow(size_t n, std::chrono::milliseconds max);

 private:
  void Enqueue(const PublishItem& item);
  void FlushLocked();  // REQUIRES: flush_mu_ held

  // Items of failed batches, waiting for their next try. Shared with the
  // transport callbacks, which may outlive the publisher.
  struct Retry {
    PublishItem item;
    uint32_t attempt = 0;  // tries made so far
    Clock::time_point due;
  };
  struct RetryQueue {
    std::mutex mu;
    std::deque<Retry> items;  // protected by mu; roughly in due order
  };

  const PublisherOptions opts_;
  Cluster* const cluster_;
  Directory* const directory_;
  Executor* const executor_;
  const Clock* const clock_;
  std::mutex mu_;
  std::vector<PublishItem> queue_;  // protected by mu_
  bool flush_scheduled_ = false;    // protected by mu_
  std::condition_variable drained_;  // a flush took the queue (mu_)
  std::shared_ptr<RetryQueue> retry_ = std::make_shared<RetryQueue>();
  std::mutex flush_mu_;             // one Flush at a time (keeps batches in order)
  Counter* sent_;
  Counter* dropped_;
  Counter* errors_;
  Counter* retried_;
  Counter* queued_adds_;
  Counter* queued_removes_;
};

}  // namespace kvpool::cluster
