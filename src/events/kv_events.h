// KvEventsPublisher: tells cache-aware routers what a node holds, as KV
// events (kv_events_format.h) on a ZMQ PUB socket with a replay socket.
//
// It hears the store's holdings stream (store/holdings.h) through the
// block descriptors (blocks/descriptor_table.h): an entry
// entering DRAM is BlockStored on CPU, one moved to SSD is BlockRemoved on
// CPU and BlockStored on STORAGE, and an entry evicted, removed, handed off
// or lost from a tier is BlockRemoved on that tier's medium. OnBlockEvent only
// appends to a bounded queue; a thread batches the queue every
// batch_interval, numbers each batch, sends it without blocking (and without
// copying it: the socket shares the buffer) and keeps the last replay_batches
// for the replay socket. A full queue loses events,
// counted (kvpool_kv_events_dropped_total); a subscriber with send_hwm
// batches unread loses further batches, which the other subscribers still
// get (counted: kvpool_kv_events_subscriber_dropped_total; it sees the gap
// and replays). Neither slows the store.
//
// A block its writer described is named by its descriptor in every event
// while the node holds it (kv_events_format.h).
//
// The first batches (seq 0, and one more for each namespace topic) hold
// AllBlocksCleared: whatever a router knew of this node before it started
// is gone. Sequence numbers count every batch, whatever its topic: a
// subscriber of one topic sees gaps where the others' batches went, and
// its replay returns every topic's (it keeps those of its topic).
//
// Thread-safe. OnBlockEvent may run under the DRAM tier's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "blocks/descriptor_table.h"
#include "common/metrics.h"
#include "common/status.h"
#include "events/kv_events_format.h"
#include "store/holdings.h"

namespace kvpool::events {

// Reads a topics file (--kv-events-topics-file): NAMESPACE=TOPIC lines (the
// last '=' splits; blank lines and lines starting with # are skipped), into
// KvEventsOptions::namespace_topics' form. InvalidArgument names the line.
Result<std::map<uint32_t, std::string>> ReadNamespaceTopics(const std::string& path);

struct KvEventsOptions {
  // ZMQ endpoint the PUB socket binds (e.g. tcp://127.0.0.1:5557); empty:
  // no events.
  std::string endpoint;
  // ROUTER socket for replaying missed batches; empty: no replay.
  std::string replay_endpoint;
  // The topic frame. Routers that index pods (llm-d) read it as
  // kv@<pod>@<model>: set it so, with this node as the pod.
  std::string topic;
  // Topics of the blocks of some namespaces, by namespace tag
  // (common/key_id.h): a model's engines write one namespace, so a router
  // that reads the model from the topic files their blocks under it. A
  // batch holds one topic's events; the others use `topic`.
  std::map<uint32_t, std::string> namespace_topics;
  Encoding encoding = Encoding::kMap;
  // How blocks are named (kv_events_format.h): ints for vLLM's int mode and
  // Dynamo, or the 16-byte key ids.
  HashType hash_type = HashType::kInt64;
  // Replay answers in today's three frames or the older subscribers' two.
  ReplayFraming replay_framing = ReplayFraming::kThreeFrames;
  // How long events gather into one batch: longer makes fewer, larger
  // messages and later news.
  std::chrono::milliseconds batch_interval{10};
  // Events waiting for the next batch; beyond it new events are dropped.
  uint64_t max_queued_events = 100000;
  // Most blocks in one batch (a larger gathering is sent as several).
  uint64_t max_batch_keys = 1024;
  // A batch is sent once it holds about this many bytes (a block's event
  // is about 20 bytes, and a described block's 5 more a token): it bounds
  // what one batch costs the replay buffer and a subscriber's queue. A
  // batch holds at least one block.
  uint64_t max_batch_bytes = 256 << 10;
  // Batches kept for replay, and at most replay_bytes of them (the oldest
  // go first).
  uint64_t replay_batches = 1000;
  uint64_t replay_bytes = 64 << 20;
  // Batches the PUB socket queues per subscriber before it drops (ZMQ's
  // send high-water mark): with max_batch_bytes, what a subscriber that
  // stops reading can cost in memory (at most 256 MB by default; about 20
  // MB when blocks are undescribed).
  int send_hwm = 1000;

  bool enabled() const { return !endpoint.empty(); }
  Status Validate() const;
};

class KvEventsPublisher final : public blocks::BlockEventListener {
 public:
  // Binds the sockets and starts the batching thread.
  static Result<std::unique_ptr<KvEventsPublisher>> Start(const KvEventsOptions& options,
                                                         MetricsRegistry* metrics);
  ~KvEventsPublisher() override;  // stops the thread, sends what is queued

  void OnBlockEvent(const HoldingsEvent& event,
                    const blocks::Descriptor& descriptor) override;
  // Queues BlockStored on STORAGE for an entry the SSD tier held when the
  // node started (the holdings stream does not tell those).
  void Recovered(const KeyId& key);

  // Called on the batching thread at the start of every batch round, before
  // it takes what is queued (null: none): the descriptor table applies its
  // queued changes there (blocks::DescriptorTable::Sync), so their events
  // go out in the same round, with no thread of the table's own to wake.
  // It may call OnBlockEvent; it must not block.
  void SetBeforeBatch(std::function<void()> fn);

  // The endpoints as bound (a tcp port of 0 resolved), for tests.
  std::string bound_endpoint() const;
  std::string bound_replay_endpoint() const;

  struct Impl;

 private:
  explicit KvEventsPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::events
