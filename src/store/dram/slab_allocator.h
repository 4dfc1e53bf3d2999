// SlabAllocator: carves the segment into slabs, assigns slabs to size
// classes, and keeps per-slot metadata (SlotMeta) and per-class free lists.
// Values above slab_bytes take a run of contiguous whole slabs (the "large"
// class, one slot per run). It decides nothing about eviction or balance:
// DramStore drives it.
//
// Slot ids are (slab index << slot_bits) | index in slab, so finding a slot's
// metadata is two array lookups and needs no table of its own.
//
// Not thread-safe; owned by DramStore under its mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/check.h"
#include "common/key_id.h"

namespace kvpool::dram {

inline constexpr uint32_t kNoSlot = UINT32_MAX;
inline constexpr uint32_t kNoSlab = UINT32_MAX;
inline constexpr uint16_t kNoClass = UINT16_MAX;  // slab not assigned
inline constexpr uint16_t kRunTail = UINT16_MAX - 1;  // slab inside a run, not its head

// kZombie: removed while pinned (cleared and freed by the last Unpin);
// kUnlisted: a pinned copy never in the index (PinUncommitted; freed by the
// last Unpin, its bytes left as an evicted entry's are).
enum class SlotState : uint8_t { kFree, kReserved, kCommitted, kZombie, kUnlisted };
enum QueueId : uint8_t { kQueueNone = 0, kQueueSmall = 1, kQueueMain = 2, kQueueWindow = 3 };
enum HintId : uint8_t { kHintNone = 0, kHintRetained = 1, kHintPinned = 2, kHintDemoted = 3 };

// 32 bytes per slot. prev/next link the slot into its class's free list while
// free and into an eviction queue while committed.
struct SlotMeta {
  KeyId key;
  uint32_t prev = kNoSlot;
  uint32_t next = kNoSlot;
  uint32_t size = 0;  // value bytes (<= the slot's bytes)
  uint16_t pins = 0;
  SlotState state = SlotState::kFree;
  uint8_t freq : 2 = 0;   // S3-FIFO access count, saturating at 3
  uint8_t queue : 2 = kQueueNone;
  // Reserved for a value read from elsewhere (DramStore::ReserveForRead):
  // not counted against the capacity until it is committed.
  uint8_t for_read : 1 = 0;
  // A cache hint's lease (DramStore::Retain, PinFor, Demote): the entry is
  // then in the store's lease order, not the eviction policy's.
  uint8_t hint : 2 = kHintNone;
  // Brought in ahead of use (DramStore::MarkPrefetched) and not read since.
  uint8_t prefetched : 1 = 0;
};
static_assert(sizeof(SlotMeta) == 32);

// A sum of entry stamps (64-bit clocks) in 128 bits, so no count of
// entries and no clock can overflow it; kept as two words, so a Slab stays
// 8-byte aligned.
struct StampSum {
  uint64_t lo = 0;
  uint64_t hi = 0;
  void Add(uint64_t v) {
    lo += v;
    hi += lo < v ? 1 : 0;
  }
  void Sub(uint64_t v) {
    hi -= lo < v ? 1 : 0;
    lo -= v;
  }
  // The mean of n stamps (n > 0).
  uint64_t Mean(uint32_t n) const {
    return static_cast<uint64_t>(((static_cast<unsigned __int128>(hi) << 64) | lo) / n);
  }
};

struct Slab {
  std::unique_ptr<SlotMeta[]> meta;  // one per slot; null when unassigned or a run tail
  uint32_t used = 0;                 // slots not free
  uint32_t busy = 0;                 // reserved, pinned or zombie slots: cannot be reclaimed
  uint16_t cls = kNoClass;           // a class, kNoClass or kRunTail
  uint32_t run = 0;                  // run head: slabs in the run; run tail: the head's index
  // Link in the class's slab list, least recently used first (TouchSlab);
  // slab classes and run heads only.
  uint32_t prev = kNoSlab;
  uint32_t next = kNoSlab;
  uint64_t last_used = 0;  // the owner's clock at the slab's last TouchSlab
  // Per slot, the owner's clock at its entry's last commit or hit (StampIn,
  // Restamp); null when unassigned or a run tail. The sum and count are of
  // the slots stamped (entries), so their mean age is known in O(1).
  std::unique_ptr<uint64_t[]> stamps;
  StampSum stamp_sum;
  uint32_t stamped = 0;
};

class SlabAllocator;

// Doubly linked list of slots threaded through SlotMeta::prev/next.
struct SlotList {
  uint32_t head = kNoSlot;
  uint32_t tail = kNoSlot;
  uint32_t count = 0;

  void PushTail(SlabAllocator& a, uint32_t slot);
  // Links slot just before `at` (towards the head). REQUIRES: at is in this list.
  void InsertBefore(SlabAllocator& a, uint32_t at, uint32_t slot);
  void Unlink(SlabAllocator& a, uint32_t slot);
  uint32_t PopHead(SlabAllocator& a);
};

class SlabAllocator {
 public:
  // REQUIRES: capacity_bytes is a multiple of slab_bytes; class_bytes ascending,
  // from BuildSizeClasses; the slot ids fit in 32 bits (DramOptions::Validate).
  SlabAllocator(uint64_t capacity_bytes, uint64_t slab_bytes, std::vector<uint64_t> class_bytes);

  // Classes 0..large_class()-1 are slab classes; large_class() holds runs.
  uint16_t num_classes() const { return static_cast<uint16_t>(classes_.size()); }
  uint16_t large_class() const { return static_cast<uint16_t>(classes_.size() - 1); }
  uint16_t ClassFor(uint64_t size) const;
  uint64_t class_slot_bytes(uint16_t c) const { return classes_[c].slot_bytes; }
  uint64_t class_slabs(uint16_t c) const { return classes_[c].slabs; }
  // Slots in the class's slabs (for the large class: runs).
  uint64_t class_slots(uint16_t c) const { return classes_[c].slots; }
  uint64_t class_free_slots(uint16_t c) const { return classes_[c].free.count; }

  uint64_t slab_bytes() const { return slab_bytes_; }
  uint32_t num_slabs() const { return static_cast<uint32_t>(slabs_.size()); }
  uint32_t free_slabs() const { return free_slabs_; }
  Slab& slab(uint32_t i) { return slabs_[i]; }
  const Slab& slab(uint32_t i) const { return slabs_[i]; }

  uint32_t slab_of(uint32_t slot) const { return slot >> slot_bits_; }
  uint32_t index_in_slab(uint32_t slot) const { return slot & slot_mask_; }
  uint32_t SlotId(uint32_t slab, uint32_t index) const { return (slab << slot_bits_) | index; }
  SlotMeta& meta(uint32_t slot) { return slabs_[slot >> slot_bits_].meta[slot & slot_mask_]; }
  const SlotMeta& meta(uint32_t slot) const {
    return slabs_[slot >> slot_bits_].meta[slot & slot_mask_];
  }
  uint16_t class_of(uint32_t slot) const { return slabs_[slot >> slot_bits_].cls; }
  uint64_t offset(uint32_t slot) const {
    const uint32_t s = slot >> slot_bits_;
    const uint16_t c = slabs_[s].cls;
    const uint64_t in_slab =
        c == large_class() ? 0 : uint64_t{slot & slot_mask_} * classes_[c].slot_bytes;
    return static_cast<uint64_t>(s) * slab_bytes_ + in_slab;
  }
  // Bytes the slot occupies (a run's whole slabs for the large class).
  uint64_t SlotBytes(uint32_t slot) const;
  // Slots per slab for class c (1 for the large class).
  uint32_t slots_per_slab(uint16_t c) const { return classes_[c].slots_per_slab; }

  // Takes a free slot of slab class c (marks it used); kNoSlot when none.
  uint32_t PopFree(uint16_t c);
  // Returns a used slot: a slab slot goes back to its class's free list; a
  // run goes back to unassigned slabs. REQUIRES: not in any other list.
  void Free(uint32_t slot);

  // Lowest unassigned slab, or kNoSlab.
  uint32_t FindFreeSlab() const;
  // Gives an unassigned slab to slab class c; all its slots become free.
  void AssignSlab(uint32_t slab, uint16_t c);
  // Takes back a slab whose slots are all free. REQUIRES: used == 0.
  void UnassignSlab(uint32_t slab);
  // First index of n contiguous unassigned slabs, or kNoSlab.
  uint32_t FindFreeRun(uint32_t n) const;
  // Makes slabs [first, first+n) a run and returns its (used) slot.
  uint32_t AssignRun(uint32_t first, uint32_t n);

  // Entry stamps: an entry enters slot at the owner's clock `clock`
  // (StampIn), is used again (Restamp), or leaves (StampOut). Each slot's
  // slab and class keep the sum and count of their entries' stamps.
  // REQUIRES: StampIn and StampOut alternate per slot, on an assigned one.
  void StampIn(uint32_t slot, uint64_t clock);
  void Restamp(uint32_t slot, uint64_t clock);
  void StampOut(uint32_t slot);
  // The mean age at `clock` of the entries of slab i (a run's head) or of
  // class c; 0 when there are none.
  uint64_t SlabMeanAge(uint32_t i, uint64_t clock) const {
    const Slab& s = slabs_[i];
    return MeanAge(s.stamp_sum, s.stamped, clock);
  }
  // Entries of class c: its slots stamped.
  uint32_t class_entries(uint16_t c) const { return classes_[c].stamped; }
  uint64_t ClassMeanAge(uint16_t c, uint64_t clock) const {
    const Class& cl = classes_[c];
    return MeanAge(cl.stamp_sum, cl.stamped, clock);
  }

  // Sets the slab's last_used (REQUIRES: >= every other slab's) and moves it
  // to the tail of its class's slab list. REQUIRES: a slab class's slab or a
  // run head. O(1).
  void TouchSlab(uint32_t slab, uint64_t stamp);
  // The class's least recently touched slab (run head for the large class),
  // or kNoSlab; follow Slab::next for the next oldest.
  uint32_t oldest_slab(uint16_t c) const { return classes_[c].lru_head; }

  // Slots in all assigned slabs and runs, and those slabs.
  uint64_t total_slots() const { return total_slots_; }
  uint64_t assigned_slabs() const { return slabs_.size() - free_slabs_; }
  // Heap bytes of slabs, slot metadata and classes.
  uint64_t metadata_bytes() const;

 private:
  // 32-bit fields: slot ids are 32 bits, so no count exceeds that.
  struct Class {
    uint32_t slot_bytes = 0;  // 0 for the large class
    uint32_t slots_per_slab = 0;
    uint32_t slabs = 0;
    uint32_t slots = 0;
    SlotList free;
    uint32_t lru_head = kNoSlab;  // slab list, least recently touched first
    uint32_t lru_tail = kNoSlab;
    StampSum stamp_sum;  // of its entries' stamps (StampIn)
    uint32_t stamped = 0;
  };

  static uint64_t MeanAge(const StampSum& sum, uint32_t n, uint64_t clock) {
    if (n == 0) return 0;
    const uint64_t mean = sum.Mean(n);
    return clock > mean ? clock - mean : 0;
  }

  void LinkSlab(uint32_t slab);  // at the tail of its class's list
  void UnlinkSlab(uint32_t slab);

  const uint64_t slab_bytes_;
  uint32_t slot_bits_ = 0;
  uint32_t slot_mask_ = 0;
  std::vector<Class> classes_;
  std::vector<Slab> slabs_;
  uint32_t free_slabs_ = 0;
  uint64_t total_slots_ = 0;
  uint64_t meta_slots_ = 0;  // SlotMeta allocated
};

}  // namespace kvpool::dram
