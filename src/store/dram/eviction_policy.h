// EvictionPolicy: orders the committed entries of each size class and picks
// which to evict when that class needs a slot. Eviction is per class, so it
// always frees space of the size that is wanted; moving memory between
// classes is DramStore's job (slab moves).
//
//  - S3-FIFO (Yang et al., SOSP'23): a small FIFO (~10% of the class's slots)
//    that new keys enter, a main FIFO, and a ghost FIFO of fingerprints of
//    keys evicted from the small queue. A key accessed while in the small
//    queue is promoted to main on reaching its head; otherwise it is evicted
//    and remembered in the ghost; a remembered key is inserted straight into
//    main. Main is a FIFO with reinsertion (CLOCK-like, 2-bit counters).
//    One-time scans pass through the small queue without disturbing main.
//  - LRU: one list per class, an access moves the entry to the tail.
//  - prefix (the default; docs/eviction.md): segmented LRU with a ghost,
//    made for LLM prefix traffic. New keys enter a probation list, a hit
//    moves a key to a protected list (a share of the class's slots that
//    sampled shadow caches choose: shadow_shares.h; 70% to start), keys
//    evicted from probation are remembered (ghost_bloom.h) and
//    enter protected when they come back. The store touches the keys of
//    one batch last to first, so a chain's head is the most recent. One
//    victim in 512 also sends protected's oldest entry back to probation,
//    so every entry ages out once the traffic moves on ("prefix-fixed":
//    the same at a fixed 70%, "slru": that without ageing, for comparison).
//
// Pinned entries are never chosen: they are skipped (S3-FIFO: reinserted at
// their queue's tail; LRU: passed over).
//
// Not thread-safe; owned by DramStore under its mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "store/dram/dram_store.h"
#include "store/dram/slab_allocator.h"

namespace kvpool::dram {

// EvictionPolicy::Insert's colder_than for a replica.
inline constexpr uint32_t kColdEnd = kNoSlot - 1;

class EvictionPolicy {
 public:
  // One of kEvictionPolicies ("prefix", "s3fifo", "lru", "slru",
  // "prefix-fixed", "tinylfu"); null for anything else.
  static std::unique_ptr<EvictionPolicy> Create(std::string_view name, SlabAllocator* alloc);
  virtual ~EvictionPolicy() = default;

  // A committed entry enters the cache. colder_than: the committed entry of
  // the same chain written just before it, kColdEnd for a replica of
  // another node's entry, or kNoSlot; a policy that keeps chains from their
  // head (TouchChainsHeadLast) places the new entry just colder than that
  // entry, or a replica first in line to go. The others ignore it.
  // returning: the writer knows the key left the cache lately (another
  // node's ghost, DramStore::Commit): treated as the policy's own ghost hit.
  // run: the chain's leading run so far, as the policy tracks it
  // (DramStore::ChainPlace::run), updated; null for an entry alone.
  virtual void Insert(uint32_t slot, uint16_t cls, uint32_t colder_than = kNoSlot,
                      bool returning = false, uint8_t* run = nullptr) = 0;
  // A hit.
  virtual void Touch(uint32_t slot, uint16_t cls) = 0;
  // The Touch calls between BeginHits and EndHits are one batch's hits, a
  // block chain read from its head (touched in TouchChainsHeadLast's
  // order). *run (if not null): the chain's leading run at its end, for
  // the chain's writes that follow (Insert).
  virtual void BeginHits() {}
  virtual void EndHits(uint8_t* run) { (void)run; }
  // The entry leaves the cache other than through PickVictim.
  virtual void Erase(uint32_t slot, uint16_t cls) = 0;
  // Unlinks and returns the entry of `cls` to evict next; kNoSlot when every
  // entry is pinned or there is none.
  virtual uint32_t PickVictim(uint16_t cls) = 0;
  // The store can now hold about `entries` entries (sizes the ghost).
  virtual void SetCapacityEntries(uint64_t entries) = 0;
  // Heap bytes of the policy's own structures.
  virtual uint64_t bytes() const = 0;
  // What the policy adapts to the traffic (adaptive == false: nothing).
  virtual EvictionAdaptation adaptation() const { return {}; }
  // Whether the hits of one batch should be touched last to first: a batch
  // of an engine is a block chain in order, and touching its head last makes
  // the head the most recent, so a chain is evicted from its tail. Fixed for
  // the policy's life.
  bool TouchChainsHeadLast() const { return chains_head_last_; }

 protected:
  explicit EvictionPolicy(bool chains_head_last = false) : chains_head_last_(chains_head_last) {}

 private:
  const bool chains_head_last_;
};

}  // namespace kvpool::dram
