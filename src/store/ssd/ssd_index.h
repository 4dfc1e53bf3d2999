// SsdIndex: key → record location for the SSD tier, 16 bytes a slot.
//
// Open addressing with linear probing and backward-shift deletion; grows
// (doubling) past 80% load, so a full table costs 16 / 0.8 = 20 bytes per
// entry. A slot keeps only a 40-bit tag of the key (its home bucket is a
// hash of the tag, so the table can grow and delete without the key): two
// keys with one tag are taken for one another (about N^2 / 2^41 pairs: 0.5
// per million entries). The full key id in the record header catches that
// at read time: a colliding read is a miss, never wrong bytes. Callers hash
// once: `h` is KeyId::hi (uniform: SHA-256 output).
// Not thread-safe; SsdStore guards it with its mutex.
#pragma once

#include <cstdint>
#include <vector>

namespace kvpool::ssd {

struct IndexLoc {
  uint32_t region = 0;   // global region number (dir * regions_per_dir + i), < 2^24 - 1
  uint64_t offset = 0;   // of the record header inside its region; 64-aligned, < 1 GiB
  uint32_t length = 0;   // value bytes
  uint32_t reads = 0;    // saturates at 255
};

class SsdIndex {
 public:
  static constexpr uint32_t kMaxReads = 255;
  static constexpr uint32_t kMaxRegions = 0xFFFFFF;
  static constexpr uint64_t kMaxRegionBytes = 1ull << 30;

  explicit SsdIndex(uint64_t initial_slots = 1024);

  // False (and no change) when h is present already.
  bool Insert(uint64_t h, const IndexLoc& loc);
  bool Find(uint64_t h, IndexLoc* loc) const;
  // Counts a read (saturating); false when absent.
  bool BumpReads(uint64_t h);
  bool Erase(uint64_t h);
  // Erases h only if it points at `region` (a region being reclaimed may
  // list keys whose entries were replaced since).
  bool EraseIfIn(uint64_t h, uint32_t region);
  // Erases h only if it points exactly at (region, offset).
  bool EraseIfAt(uint64_t h, uint32_t region, uint64_t offset);
  void Clear();

  uint64_t size() const { return size_; }
  uint64_t slots() const { return slots_.size(); }
  uint64_t bytes() const { return slots_.size() * sizeof(Slot); }
  static constexpr uint64_t kSlotBytes = 16;
  static constexpr double kMaxLoad = 0.8;

 private:
  struct Slot {
    uint32_t tag_lo;      // tag bits 0..31
    uint32_t region_tag;  // region in the low 24 bits (kEmpty: free), tag bits 32..39 above
    uint32_t off_reads;   // offset / 64 in the low 24 bits, reads in the top 8
    uint32_t length;
    bool empty() const { return (region_tag & 0xFFFFFF) == kEmpty; }
    uint32_t region() const { return region_tag & 0xFFFFFF; }
    uint64_t tag() const { return tag_lo | (static_cast<uint64_t>(region_tag >> 24) << 32); }
  };
  static_assert(sizeof(Slot) == kSlotBytes);
  static constexpr uint32_t kEmpty = 0xFFFFFF;

  static uint64_t Tag(uint64_t h) { return h >> 24; }
  uint64_t HomeOfTag(uint64_t tag) const { return (tag * 0x9E3779B97F4A7C15ull) >> shift_; }
  // Slot index of h, or -1.
  int64_t FindSlot(uint64_t h) const;
  void EraseSlot(uint64_t i);
  void Grow();

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int shift_ = 64;
  uint64_t size_ = 0;
};

}  // namespace kvpool::ssd
