// Publisher: tells the keys' home nodes what this node holds. Add/Remove
// queue an item; Flush() sends the queue as one Publish batch per home
// (applied directly when the home is this node). The node calls Flush()
// every few milliseconds; a queue reaching max_batch is flushed at once on
// the executor. Delivery is best effort (soft state): a failed batch is
// counted and dropped.
//
// Thread-safe; Add/Remove are quick (one mutex, no I/O) and may be called
// under the DRAM store's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/peer_messages_format.h"
#include "common/executor.h"
#include "common/metrics.h"

namespace kvpool::cluster {

struct PublisherOptions {
  // Items per batch; a full queue is flushed without waiting for the tick.
  uint32_t max_batch = 1024;
  // Queued items at most; beyond it items are dropped (and counted).
  uint32_t max_queue = 1u << 20;
  std::chrono::milliseconds timeout{1000};
};

class Publisher {
 public:
  // All pointers must outlive the publisher.
  Publisher(const PublisherOptions& options, Cluster* cluster, Directory* local_directory,
            Executor* executor, MetricsRegistry* metrics);

  void Add(const KeyId& key, uint64_t size);
  void Remove(const KeyId& key);
  void Flush();

 private:
  void Enqueue(const PublishItem& item);

  const PublisherOptions opts_;
  Cluster* const cluster_;
  Directory* const directory_;
  Executor* const executor_;
  std::mutex mu_;
  std::vector<PublishItem> queue_;  // protected by mu_
  bool flush_scheduled_ = false;    // protected by mu_
  std::mutex flush_mu_;             // one Flush at a time (keeps batches in order)
  Counter* sent_;
  Counter* dropped_;
  Counter* errors_;
};

}  // namespace kvpool::cluster
