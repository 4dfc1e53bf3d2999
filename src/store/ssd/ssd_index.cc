#include "store/ssd/ssd_index.h"

#include <bit>

#include "common/check.h"

namespace kvpool::ssd {

SsdIndex::SsdIndex(uint64_t initial_slots) {
  uint64_t n = 16;
  while (n < initial_slots) n <<= 1;
  slots_.assign(n, Slot{0, kEmpty, 0, 0});
  mask_ = n - 1;
  shift_ = 64 - std::countr_zero(n);
}

int64_t SsdIndex::FindSlot(uint64_t h) const {
  const uint64_t tag = Tag(h);
  for (uint64_t i = HomeOfTag(tag);; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.empty()) return -1;
    if (s.tag() == tag) return static_cast<int64_t>(i);
  }
}

bool SsdIndex::Insert(uint64_t h, const IndexLoc& loc) {
  KVPOOL_CHECK(loc.region < kEmpty && loc.offset % 64 == 0 && loc.offset < kMaxRegionBytes);
  if (FindSlot(h) >= 0) return false;
  if (static_cast<double>(size_ + 1) > kMaxLoad * static_cast<double>(slots_.size())) Grow();
  const uint64_t tag = Tag(h);
  uint64_t i = HomeOfTag(tag);
  while (!slots_[i].empty()) i = (i + 1) & mask_;
  uint32_t reads = loc.reads > kMaxReads ? kMaxReads : loc.reads;
  slots_[i] = Slot{static_cast<uint32_t>(tag), loc.region | static_cast<uint32_t>(tag >> 32) << 24,
                   static_cast<uint32_t>(loc.offset / 64) | (reads << 24), loc.length};
  ++size_;
  return true;
}

bool SsdIndex::Find(uint64_t h, IndexLoc* loc) const {
  int64_t i = FindSlot(h);
  if (i < 0) return false;
  const Slot& s = slots_[i];
  loc->region = s.region();
  loc->offset = static_cast<uint64_t>(s.off_reads & 0xFFFFFF) * 64;
  loc->reads = s.off_reads >> 24;
  loc->length = s.length;
  return true;
}

bool SsdIndex::BumpReads(uint64_t h) {
  int64_t i = FindSlot(h);
  if (i < 0) return false;
  Slot& s = slots_[i];
  if ((s.off_reads >> 24) < kMaxReads) s.off_reads += 1u << 24;
  return true;
}

bool SsdIndex::Erase(uint64_t h) {
  int64_t i = FindSlot(h);
  if (i < 0) return false;
  EraseSlot(static_cast<uint64_t>(i));
  return true;
}

bool SsdIndex::EraseIfIn(uint64_t h, uint32_t region) {
  int64_t i = FindSlot(h);
  if (i < 0 || slots_[i].region() != region) return false;
  EraseSlot(static_cast<uint64_t>(i));
  return true;
}

bool SsdIndex::EraseIfAt(uint64_t h, uint32_t region, uint64_t offset) {
  int64_t i = FindSlot(h);
  if (i < 0 || slots_[i].region() != region ||
      static_cast<uint64_t>(slots_[i].off_reads & 0xFFFFFF) * 64 != offset) {
    return false;
  }
  EraseSlot(static_cast<uint64_t>(i));
  return true;
}

// Backward-shift deletion: later members of the probe run move into the
// hole when their home bucket allows, so lookups never meet tombstones.
void SsdIndex::EraseSlot(uint64_t hole) {
  slots_[hole].region_tag = kEmpty;
  --size_;
  for (uint64_t j = (hole + 1) & mask_; !slots_[j].empty(); j = (j + 1) & mask_) {
    uint64_t home = HomeOfTag(slots_[j].tag());
    // j may move to the hole unless its home lies cyclically in (hole, j].
    bool home_after_hole = ((j - home) & mask_) < ((j - hole) & mask_);
    if (home_after_hole) continue;
    slots_[hole] = slots_[j];
    slots_[j].region_tag = kEmpty;
    hole = j;
  }
}

void SsdIndex::Grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  uint64_t n = old.size() * 2;
  slots_.assign(n, Slot{0, kEmpty, 0, 0});
  mask_ = n - 1;
  shift_ = 64 - std::countr_zero(n);
  for (const Slot& s : old) {
    if (s.empty()) continue;
    uint64_t i = HomeOfTag(s.tag());
    while (!slots_[i].empty()) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void SsdIndex::Clear() {
  for (Slot& s : slots_) s.region_tag = kEmpty;
  size_ = 0;
}

}  // namespace kvpool::ssd
