#include "store/dram/slab_allocator.h"

#include <gtest/gtest.h>

#include <set>

#include "store/dram/size_classes.h"

namespace kvpool::dram {
namespace {

constexpr uint64_t kSlab = 1 << 20;

SlabAllocator Make(uint64_t slabs = 8) {
  return SlabAllocator(slabs * kSlab, kSlab, BuildSizeClasses(64, 1.25, kSlab));
}

TEST(SlabAllocatorTest, ClassesAndSlots) {
  SlabAllocator a = Make();
  const uint16_t c = a.ClassFor(64 << 10);
  EXPECT_EQ(a.class_slot_bytes(c), 64u << 10);
  EXPECT_EQ(a.ClassFor((64 << 10) - 1), c);
  // The next class is at most 1.25x, widened to fill the slab (14 x 74880).
  EXPECT_EQ(a.class_slot_bytes(a.ClassFor((64 << 10) + 1)), (kSlab / 14) & ~uint64_t{63});
  EXPECT_EQ(a.ClassFor(kSlab), a.large_class() - 1);
  EXPECT_EQ(a.ClassFor(kSlab + 1), a.large_class());
  EXPECT_EQ(a.PopFree(c), kNoSlot);  // no slab yet

  const uint32_t slab = a.FindFreeSlab();
  EXPECT_EQ(slab, 0u);
  a.AssignSlab(slab, c);
  EXPECT_EQ(a.class_slabs(c), 1u);
  EXPECT_EQ(a.class_free_slots(c), 16u);
  EXPECT_EQ(a.free_slabs(), 7u);
  std::set<uint64_t> offsets;
  std::vector<uint32_t> slots;
  for (int i = 0; i < 16; ++i) {
    const uint32_t s = a.PopFree(c);
    ASSERT_NE(s, kNoSlot);
    EXPECT_EQ(a.SlotBytes(s), 64u << 10);
    offsets.insert(a.offset(s));
    slots.push_back(s);
  }
  EXPECT_EQ(a.PopFree(c), kNoSlot);
  EXPECT_EQ(offsets.size(), 16u);
  EXPECT_EQ(*offsets.begin(), 0u);
  EXPECT_EQ(*offsets.rbegin(), kSlab - (64 << 10));
  EXPECT_EQ(a.slab(0).used, 16u);
  for (uint32_t s : slots) a.Free(s);
  EXPECT_EQ(a.slab(0).used, 0u);
  a.UnassignSlab(0);
  EXPECT_EQ(a.free_slabs(), 8u);
  EXPECT_EQ(a.class_slabs(c), 0u);
  EXPECT_EQ(a.total_slots(), 0u);
}

TEST(SlabAllocatorTest, RunsTakeContiguousSlabs) {
  SlabAllocator a = Make(8);
  const uint16_t small = a.ClassFor(4096);
  a.AssignSlab(2, small);  // splits the free space: [0,1] and [3..7]
  EXPECT_EQ(a.FindFreeRun(2), 0u);
  EXPECT_EQ(a.FindFreeRun(3), 3u);
  EXPECT_EQ(a.FindFreeRun(6), kNoSlab);
  const uint32_t slot = a.AssignRun(3, 5);
  EXPECT_EQ(a.offset(slot), 3 * kSlab);
  EXPECT_EQ(a.SlotBytes(slot), 5 * kSlab);
  EXPECT_EQ(a.class_of(slot), a.large_class());
  EXPECT_EQ(a.slab(5).cls, kRunTail);
  EXPECT_EQ(a.slab(5).run, 3u);
  EXPECT_EQ(a.class_slabs(a.large_class()), 5u);
  EXPECT_EQ(a.free_slabs(), 2u);
  a.Free(slot);
  EXPECT_EQ(a.free_slabs(), 7u);
  EXPECT_EQ(a.FindFreeRun(5), 3u);
  EXPECT_EQ(a.class_slabs(a.large_class()), 0u);
}

// Each class's slabs (run heads for the large class) are listed least
// recently touched first.
TEST(SlabAllocatorTest, SlabListsOrderedByLastTouch) {
  SlabAllocator a = Make(8);
  const uint16_t c = a.ClassFor(64 << 10), d = a.ClassFor(4096);
  auto list = [&](uint16_t cls) {
    std::vector<uint32_t> v;
    for (uint32_t i = a.oldest_slab(cls); i != kNoSlab; i = a.slab(i).next) v.push_back(i);
    return v;
  };
  EXPECT_EQ(a.oldest_slab(c), kNoSlab);
  for (uint32_t i : {0u, 1u, 2u}) {
    a.AssignSlab(i, c);
    a.TouchSlab(i, 10 + i);
  }
  a.AssignSlab(3, d);
  a.TouchSlab(3, 13);
  EXPECT_EQ(list(c), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(list(d), (std::vector<uint32_t>{3}));
  a.TouchSlab(0, 20);  // middle and tail moves
  a.TouchSlab(2, 21);
  a.TouchSlab(2, 22);  // already the tail
  EXPECT_EQ(list(c), (std::vector<uint32_t>{1, 0, 2}));
  EXPECT_EQ(a.slab(2).last_used, 22u);
  a.UnassignSlab(0);
  EXPECT_EQ(list(c), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(a.slab(0).last_used, 0u);
  const uint32_t run = a.AssignRun(4, 3);
  a.TouchSlab(a.slab_of(run), 30);
  EXPECT_EQ(list(a.large_class()), (std::vector<uint32_t>{4}));
  a.Free(run);
  EXPECT_EQ(a.oldest_slab(a.large_class()), kNoSlab);
}

// 32 bytes of SlotMeta and an 8-byte entry stamp per slot.
TEST(SlabAllocatorTest, MetadataIsFortyBytesPerSlot) {
  SlabAllocator a = Make(8);
  const uint64_t base = a.metadata_bytes();
  a.AssignSlab(0, a.ClassFor(64 << 10));  // 16 slots
  EXPECT_EQ(a.metadata_bytes() - base, 16 * 40u);
  EXPECT_EQ(sizeof(SlotMeta), 32u);
}

// A slab's and a class's mean entry age follow the stamps in, restamped
// and out, exactly; sums past 64 bits (stamps near 2^64) do not wrap.
TEST(SlabAllocatorTest, MeanEntryAgeFollowsStamps) {
  SlabAllocator a = Make(8);
  const uint16_t c = a.ClassFor(64 << 10);
  a.AssignSlab(0, c);
  a.AssignSlab(1, c);
  constexpr uint64_t kUnit = 4096;
  EXPECT_EQ(a.SlabMeanAge(0, 100 * kUnit), 0u);  // no entries
  const uint32_t s0 = a.PopFree(c), s1 = a.PopFree(c);
  ASSERT_EQ(a.slab_of(s0), a.slab_of(s1));
  a.StampIn(s0, 10 * kUnit);
  a.StampIn(s1, 30 * kUnit);
  EXPECT_EQ(a.SlabMeanAge(a.slab_of(s0), 100 * kUnit), 80 * kUnit);
  a.Restamp(s0, 50 * kUnit);  // a hit
  EXPECT_EQ(a.SlabMeanAge(a.slab_of(s0), 100 * kUnit), 60 * kUnit);
  a.StampOut(s1);
  EXPECT_EQ(a.SlabMeanAge(a.slab_of(s0), 100 * kUnit), 50 * kUnit);
  EXPECT_EQ(a.ClassMeanAge(c, 100 * kUnit), 50 * kUnit);
  a.StampOut(s0);
  EXPECT_EQ(a.SlabMeanAge(a.slab_of(s0), 100 * kUnit), 0u);
  EXPECT_EQ(a.ClassMeanAge(c, 100 * kUnit), 0u);
  // 16 entries stamped near the clock's end: their sum needs 68 bits.
  const uint64_t late = ~uint64_t{0} - 1000;
  std::vector<uint32_t> slots;
  for (int i = 0; i < 16; ++i) {
    slots.push_back(a.PopFree(c));
    a.StampIn(slots.back(), late - 10 * i);
  }
  EXPECT_EQ(a.ClassMeanAge(c, late), 75u);  // ages 0, 10, ..., 150
  for (uint32_t s : slots) a.StampOut(s);
  EXPECT_EQ(a.ClassMeanAge(c, late), 0u);
}

}  // namespace
}  // namespace kvpool::dram
