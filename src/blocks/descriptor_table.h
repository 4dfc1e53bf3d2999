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
// (null: none). Per engine hash (EngineHash64) the table counts the
// described keys each tier holds, and tells the tier listener when a hash
// gains its first key in a tier or loses its last.
//
// Bounded: at most max_bytes of descriptors (each counted as its bytes plus
// kEntryOverheadBytes); a stage beyond that is refused and the key is told
// undescribed. Reported as kvpool_descriptors, kvpool_descriptor_bytes and
// kvpool_descriptors_refused_total.
//
// Thread-safe (one mutex, held for a hash-table operation and the
// listeners' calls, which must be quick and never call back into the table
// or the store; the stream may arrive under the DRAM tier's lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/key_id.h"
#include "common/metrics.h"
#include "protocol/descriptor_format.h"
#include "store/holdings.h"

namespace kvpool::blocks {

enum class BlockTier : uint8_t { kDram = 0, kSsd = 1 };

// The 64-bit form of an engine hash, as vLLM's int mode and Dynamo read
// it: an int as it is, bytes as their last 8 bytes, big-endian.
uint64_t EngineHash64(const protocol::EngineHash& h);
uint64_t EngineHash64(const protocol::EngineHashView& h);

// Told every holdings event, in the table's order, with the key's
// descriptor bytes (null: the key has none).
class BlockEventListener {
 public:
  virtual ~BlockEventListener() = default;
  virtual void OnBlockEvent(const HoldingsEvent& event,
                            const std::shared_ptr<const std::string>& descriptor) = 0;
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

  // metrics must outlive the table.
  DescriptorTable(uint64_t max_bytes, MetricsRegistry* metrics);
  ~DescriptorTable() override;
  DescriptorTable(const DescriptorTable&) = delete;
  DescriptorTable& operator=(const DescriptorTable&) = delete;

  // Set before the store streams to the table; each may be null. Must
  // outlive the table's observation of the store.
  void SetListeners(BlockEventListener* events, BlockTierListener* tiers);

  // Stages key's descriptor (checked by the caller) for the commit that
  // follows. Returns a token for Unstage, or 0 when nothing was staged: the
  // table is full (counted) or the bytes do not decode; the key is then
  // told undescribed. A later stage of the same key replaces an earlier one.
  uint64_t Stage(const KeyId& key, std::shared_ptr<const std::string> descriptor);
  // The commit failed: drops the stage `token` made, unless another stage
  // replaced it or the key entered the node with it.
  void Unstage(const KeyId& key, uint64_t token);

  void OnHoldings(const HoldingsEvent& event) override;

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
