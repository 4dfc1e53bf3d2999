// DescriptorTable: the block descriptors (protocol/descriptor_format.h) of
// the keys a node holds, so the node can name each block the way its engine
// does: in KV events (events/kv_events.h) and in the block index that
// answers routers' prefix lookups (cluster/block_index.h).
//
// A writer stages a key's descriptor just before it commits the key and
// unstages it when the commit fails. The table observes the store's
// holdings stream (store/holdings.h, slot kBlocks): the event that brings a
// key into the node takes its staged descriptor, every later event of the
// key carries it, and the event that takes the key out of the node drops
// it. Each event goes on to the event listener with the key's descriptor
// (none: the key is undescribed). Per engine hash (EngineHash64) the table
// counts the described keys each tier holds, and tells the tier listener
// when a hash gains its first key in a tier or loses its last.
//
// Off the write path: a stage, an unstage and a holdings event are only
// queued, in the order they are told, and applied in that order on the
// table's own thread within apply_interval, or at once by a read (Tiers,
// ForEachHeld, entries, bytes, Sync), so what a read returns follows every
// change told before it. A table made with an apply interval of 0 has no
// thread: its owner calls Sync as often (the node's KV events publisher
// does, on its own thread, before each batch). Listeners are called by the
// applying thread. While
// the table holds nothing and has nothing queued, a holdings event goes to
// the event listener at once. At most kMaxQueued changes wait: the one that
// finds the queue full applies it on its own thread.
//
// Bounded: at most max_bytes of descriptors (each counted as its bytes plus
// kEntryOverheadBytes, from its stage until it goes); a stage beyond that
// is refused and the key is told undescribed. Reported as
// kvpool_descriptors, kvpool_descriptor_bytes and
// kvpool_descriptors_refused_total.
//
// Thread-safe. Listeners must be quick and never call back into the table
// or the store; holdings events may arrive under the DRAM tier's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "blocks/descriptor.h"
#include "common/key_id.h"
#include "common/metrics.h"
#include "store/holdings.h"

namespace kvpool::blocks {

enum class BlockTier : uint8_t { kDram = 0, kSsd = 1 };

// Told every holdings event, in the table's order, with the key's
// descriptor (none: the key has none).
class BlockEventListener {
 public:
  virtual ~BlockEventListener() = default;
  virtual void OnBlockEvent(const HoldingsEvent& event, const Descriptor& descriptor) = 0;
};

// Told when this node starts (held) or stops holding any key described
// with engine hash `hash` in `tier`.
class BlockTierListener {
 public:
  virtual ~BlockTierListener() = default;
  virtual void OnBlockTier(uint64_t hash, BlockTier tier, bool held) = 0;
};

class DescriptorTable final : public HoldingsObserver {
 public:
  // Bytes an entry costs besides its descriptor (the tables' nodes and key).
  static constexpr uint64_t kEntryOverheadBytes = 96;
  // Changes queued at most (about 80 bytes each).
  static constexpr size_t kMaxQueued = 1 << 16;
  // How long a change waits for the table's thread at most (a read applies
  // at once). Each round wakes the thread: on 2 cores, rounds of 1 ms cost
  // the node a tenth of its put rate against rounds of 10 ms.
  static constexpr std::chrono::microseconds kDefaultApplyInterval{10'000};

  // metrics must outlive the table. apply_interval 0: no thread of its own
  // (the owner calls Sync).
  DescriptorTable(uint64_t max_bytes, MetricsRegistry* metrics,
                  std::chrono::microseconds apply_interval = kDefaultApplyInterval);
  ~DescriptorTable() override;
  DescriptorTable(const DescriptorTable&) = delete;
  DescriptorTable& operator=(const DescriptorTable&) = delete;

  // Applies what is queued to the listeners set before, then sets these;
  // each may be null. Each must stay valid until it is replaced here.
  void SetListeners(BlockEventListener* events, BlockTierListener* tiers);

  // Stages key's descriptor for the commit that follows. Returns a token
  // for Unstage, or 0 when nothing was staged: there is no descriptor, or
  // the table is full (counted); the key is then told undescribed. A later
  // stage of the same key replaces an earlier one.
  uint64_t Stage(const KeyId& key, Descriptor descriptor);
  // The commit failed: drops the stage `token` made, unless another stage
  // replaced it or the key entered the node with it.
  void Unstage(const KeyId& key, uint64_t token);

  void OnHoldings(const HoldingsEvent& event) override;

  // Applies every change queued before the call.
  void Sync();

  // Per hash, the tiers this node holds a key described with it in:
  // bit 0 DRAM, bit 1 SSD (0: none).
  void Tiers(std::span<const uint64_t> hashes, uint8_t* out) const;
  // Calls fn(hash, tier) for every (hash, tier) this node holds, under the
  // table's lock (fn must be quick: a block index's replay).
  void ForEachHeld(const std::function<void(uint64_t, BlockTier)>& fn) const;

  uint64_t entries() const;
  uint64_t bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::blocks
