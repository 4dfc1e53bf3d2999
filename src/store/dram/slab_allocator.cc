#include "store/dram/slab_allocator.h"

#include <algorithm>

namespace kvpool::dram {

void SlotList::PushTail(SlabAllocator& a, uint32_t slot) {
  SlotMeta& m = a.meta(slot);
  m.prev = tail;
  m.next = kNoSlot;
  if (tail == kNoSlot) {
    head = slot;
  } else {
    a.meta(tail).next = slot;
  }
  tail = slot;
  ++count;
}

void SlotList::InsertBefore(SlabAllocator& a, uint32_t at, uint32_t slot) {
  SlotMeta& m = a.meta(slot);
  SlotMeta& next = a.meta(at);
  m.prev = next.prev;
  m.next = at;
  if (next.prev == kNoSlot) {
    KVPOOL_CHECK(head == at);
    head = slot;
  } else {
    a.meta(next.prev).next = slot;
  }
  next.prev = slot;
  ++count;
}

void SlotList::Unlink(SlabAllocator& a, uint32_t slot) {
  SlotMeta& m = a.meta(slot);
  if (m.prev == kNoSlot) {
    KVPOOL_CHECK(head == slot);
    head = m.next;
  } else {
    a.meta(m.prev).next = m.next;
  }
  if (m.next == kNoSlot) {
    KVPOOL_CHECK(tail == slot);
    tail = m.prev;
  } else {
    a.meta(m.next).prev = m.prev;
  }
  m.prev = m.next = kNoSlot;
  KVPOOL_CHECK(count > 0);
  --count;
}

uint32_t SlotList::PopHead(SlabAllocator& a) {
  const uint32_t slot = head;
  if (slot != kNoSlot) Unlink(a, slot);
  return slot;
}

SlabAllocator::SlabAllocator(uint64_t capacity_bytes, uint64_t slab_bytes,
                             std::vector<uint64_t> class_bytes)
    : slab_bytes_(slab_bytes) {
  KVPOOL_CHECK(!class_bytes.empty() && capacity_bytes % slab_bytes == 0);
  const uint64_t max_slots = slab_bytes / class_bytes.front();
  while ((uint64_t{1} << slot_bits_) < max_slots) ++slot_bits_;
  slot_mask_ = static_cast<uint32_t>((uint64_t{1} << slot_bits_) - 1);
  const uint64_t n = capacity_bytes / slab_bytes;
  KVPOOL_CHECK((n << slot_bits_) < kNoSlot);
  for (uint64_t b : class_bytes) {
    Class c;
    c.slot_bytes = static_cast<uint32_t>(b);
    c.slots_per_slab = static_cast<uint32_t>(slab_bytes / b);
    classes_.push_back(c);
  }
  Class large;
  large.slots_per_slab = 1;
  classes_.push_back(large);
  KVPOOL_CHECK(classes_.size() < kRunTail);
  slabs_.resize(n);
  free_slabs_ = static_cast<uint32_t>(n);
}

uint16_t SlabAllocator::ClassFor(uint64_t size) const {
  if (size > slab_bytes_) return large_class();
  auto it = std::lower_bound(classes_.begin(), classes_.end() - 1, size,
                             [](const Class& c, uint64_t s) { return c.slot_bytes < s; });
  KVPOOL_CHECK(it != classes_.end() - 1);
  return static_cast<uint16_t>(it - classes_.begin());
}

uint64_t SlabAllocator::SlotBytes(uint32_t slot) const {
  const Slab& s = slabs_[slab_of(slot)];
  return s.cls == large_class() ? uint64_t{s.run} * slab_bytes_ : classes_[s.cls].slot_bytes;
}

uint32_t SlabAllocator::PopFree(uint16_t c) {
  const uint32_t slot = classes_[c].free.PopHead(*this);
  if (slot != kNoSlot) ++slabs_[slab_of(slot)].used;
  return slot;
}

void SlabAllocator::Free(uint32_t slot) {
  const uint32_t si = slab_of(slot);
  Slab& s = slabs_[si];
  SlotMeta& m = meta(slot);
  KVPOOL_CHECK(s.used > 0 && m.pins == 0);
  m.state = SlotState::kFree;
  m.queue = kQueueNone;
  m.hint = kHintNone;
  --s.used;
  if (s.cls != large_class()) {
    classes_[s.cls].free.PushTail(*this, slot);
    return;
  }
  // A run: every slab goes back to unassigned.
  UnlinkSlab(si);
  const uint32_t n = s.run;
  Class& large = classes_[large_class()];
  large.slabs -= n;
  --large.slots;
  --total_slots_;
  --meta_slots_;
  for (uint32_t i = si; i < si + n; ++i) {
    slabs_[i] = Slab{};
  }
  free_slabs_ += n;
}

uint32_t SlabAllocator::FindFreeSlab() const {
  if (free_slabs_ == 0) return kNoSlab;
  for (uint32_t i = 0; i < slabs_.size(); ++i) {
    if (slabs_[i].cls == kNoClass) return i;
  }
  KVPOOL_CHECK(false);
  return kNoSlab;
}

void SlabAllocator::AssignSlab(uint32_t si, uint16_t c) {
  Slab& s = slabs_[si];
  KVPOOL_CHECK(s.cls == kNoClass && c < large_class());
  Class& cl = classes_[c];
  s.cls = c;
  s.used = 0;
  s.busy = 0;
  s.meta = std::make_unique<SlotMeta[]>(cl.slots_per_slab);
  s.stamps = std::make_unique<uint64_t[]>(cl.slots_per_slab);
  for (uint32_t i = 0; i < cl.slots_per_slab; ++i) cl.free.PushTail(*this, SlotId(si, i));
  LinkSlab(si);
  ++cl.slabs;
  cl.slots += cl.slots_per_slab;
  total_slots_ += cl.slots_per_slab;
  meta_slots_ += cl.slots_per_slab;
  --free_slabs_;
}

void SlabAllocator::UnassignSlab(uint32_t si) {
  Slab& s = slabs_[si];
  KVPOOL_CHECK(s.cls < large_class() && s.used == 0 && s.busy == 0);
  Class& cl = classes_[s.cls];
  for (uint32_t i = 0; i < cl.slots_per_slab; ++i) cl.free.Unlink(*this, SlotId(si, i));
  UnlinkSlab(si);
  --cl.slabs;
  cl.slots -= cl.slots_per_slab;
  total_slots_ -= cl.slots_per_slab;
  meta_slots_ -= cl.slots_per_slab;
  s = Slab{};
  ++free_slabs_;
}

uint32_t SlabAllocator::FindFreeRun(uint32_t n) const {
  if (free_slabs_ < n) return kNoSlab;
  uint32_t len = 0;
  for (uint32_t i = 0; i < slabs_.size(); ++i) {
    len = slabs_[i].cls == kNoClass ? len + 1 : 0;
    if (len == n) return i + 1 - n;
  }
  return kNoSlab;
}

uint32_t SlabAllocator::AssignRun(uint32_t first, uint32_t n) {
  KVPOOL_CHECK(n >= 1 && first + n <= slabs_.size());
  for (uint32_t i = first; i < first + n; ++i) {
    KVPOOL_CHECK(slabs_[i].cls == kNoClass);
    slabs_[i].cls = kRunTail;
    slabs_[i].run = first;
  }
  Slab& head = slabs_[first];
  head.cls = large_class();
  head.run = n;
  head.used = 1;
  head.busy = 0;
  head.meta = std::make_unique<SlotMeta[]>(1);
  head.stamps = std::make_unique<uint64_t[]>(1);
  LinkSlab(first);
  Class& large = classes_[large_class()];
  large.slabs += n;
  ++large.slots;
  ++total_slots_;
  ++meta_slots_;
  free_slabs_ -= n;
  return SlotId(first, 0);
}

void SlabAllocator::LinkSlab(uint32_t si) {
  Slab& s = slabs_[si];
  Class& cl = classes_[s.cls];
  s.prev = cl.lru_tail;
  s.next = kNoSlab;
  if (cl.lru_tail == kNoSlab) {
    cl.lru_head = si;
  } else {
    slabs_[cl.lru_tail].next = si;
  }
  cl.lru_tail = si;
}

void SlabAllocator::UnlinkSlab(uint32_t si) {
  Slab& s = slabs_[si];
  Class& cl = classes_[s.cls];
  if (s.prev == kNoSlab) {
    KVPOOL_CHECK(cl.lru_head == si);
    cl.lru_head = s.next;
  } else {
    slabs_[s.prev].next = s.next;
  }
  if (s.next == kNoSlab) {
    KVPOOL_CHECK(cl.lru_tail == si);
    cl.lru_tail = s.prev;
  } else {
    slabs_[s.next].prev = s.prev;
  }
  s.prev = s.next = kNoSlab;
}

void SlabAllocator::TouchSlab(uint32_t si, uint64_t stamp) {
  Slab& s = slabs_[si];
  KVPOOL_CHECK(s.cls < classes_.size());
  s.last_used = stamp;
  if (classes_[s.cls].lru_tail == si) return;
  UnlinkSlab(si);
  LinkSlab(si);
}

void SlabAllocator::StampIn(uint32_t slot, uint64_t clock) {
  Slab& s = slabs_[slab_of(slot)];
  Class& cl = classes_[s.cls];
  s.stamps[index_in_slab(slot)] = clock;
  s.stamp_sum.Add(clock);
  ++s.stamped;
  cl.stamp_sum.Add(clock);
  ++cl.stamped;
}

void SlabAllocator::Restamp(uint32_t slot, uint64_t clock) {
  Slab& s = slabs_[slab_of(slot)];
  Class& cl = classes_[s.cls];
  uint64_t& stamp = s.stamps[index_in_slab(slot)];
  const uint64_t add = clock - stamp;  // stamps only grow
  s.stamp_sum.Add(add);
  cl.stamp_sum.Add(add);
  stamp = clock;
}

void SlabAllocator::StampOut(uint32_t slot) {
  Slab& s = slabs_[slab_of(slot)];
  Class& cl = classes_[s.cls];
  const uint64_t stamp = s.stamps[index_in_slab(slot)];
  KVPOOL_CHECK(s.stamped > 0 && cl.stamped > 0);
  s.stamp_sum.Sub(stamp);
  --s.stamped;
  cl.stamp_sum.Sub(stamp);
  --cl.stamped;
}

uint64_t SlabAllocator::metadata_bytes() const {
  return slabs_.capacity() * sizeof(Slab) + classes_.capacity() * sizeof(Class) +
         meta_slots_ * (sizeof(SlotMeta) + sizeof(uint64_t));
}

}  // namespace kvpool::dram
