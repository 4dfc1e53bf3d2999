#include "store/dram/slot_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

#include "store/dram/dram_test_util.h"

namespace kvpool::dram {
namespace {

using testing::Key;

class SlotIndexTest : public ::testing::Test {
 protected:
  // slot -> key, as the store's slot metadata would hold it.
  std::vector<KeyId> keys_ = std::vector<KeyId>(1 << 20);
  SlotIndex index_;
  uint32_t Find(const KeyId& k) const {
    return index_.Find(k, [this](uint32_t s) -> const KeyId& { return keys_[s]; });
  }
  void Insert(const KeyId& k, uint32_t slot) {
    keys_[slot] = k;
    index_.Insert(k, slot);
  }
};

TEST_F(SlotIndexTest, InsertFindErase) {
  for (uint32_t i = 0; i < 1000; ++i) Insert(Key(i), i);
  EXPECT_EQ(index_.size(), 1000u);
  for (uint32_t i = 0; i < 1000; ++i) EXPECT_EQ(Find(Key(i)), i);
  EXPECT_EQ(Find(Key(5000)), SlotIndex::kNotFound);
  EXPECT_FALSE(index_.Erase(Key(3), 4));  // right key, wrong slot
  EXPECT_TRUE(index_.Erase(Key(3), 3));
  EXPECT_FALSE(index_.Erase(Key(3), 3));
  EXPECT_EQ(Find(Key(3)), SlotIndex::kNotFound);
  EXPECT_EQ(index_.size(), 999u);
  // Load stays within (0.3, 0.9].
  EXPECT_LE(index_.size() * 10, index_.capacity() * 9);
}

TEST_F(SlotIndexTest, SameTagDifferentKeys) {
  // Same 32-bit tag (lo >> 32), so the same home: told apart by the full key.
  const KeyId a{1, 0xabcdef0100000001ull}, b{2, 0xabcdef0100000002ull}, c{3, 0xabcdef01ffffffffull};
  Insert(a, 10);
  Insert(b, 11);
  Insert(c, 12);
  EXPECT_EQ(Find(a), 10u);
  EXPECT_EQ(Find(b), 11u);
  EXPECT_EQ(Find(c), 12u);
  EXPECT_TRUE(index_.Erase(b, 11));
  EXPECT_EQ(Find(a), 10u);
  EXPECT_EQ(Find(b), SlotIndex::kNotFound);
  EXPECT_EQ(Find(c), 12u);
}

TEST_F(SlotIndexTest, ChurnMatchesReferenceModel) {
  // Backward-shift deletion must keep every remaining key reachable.
  std::mt19937_64 rng(42);
  std::unordered_map<uint64_t, uint32_t> model;  // key number -> slot
  std::vector<uint32_t> free_slots;
  for (uint32_t s = 0; s < 50000; ++s) free_slots.push_back(s);
  for (int op = 0; op < 400000; ++op) {
    const uint64_t k = rng() % 60000;
    auto it = model.find(k);
    if (it == model.end()) {
      if (free_slots.empty()) continue;
      const uint32_t slot = free_slots.back();
      free_slots.pop_back();
      Insert(Key(k), slot);
      model[k] = slot;
    } else if (rng() % 2 == 0) {
      ASSERT_TRUE(index_.Erase(Key(k), it->second));
      free_slots.push_back(it->second);
      model.erase(it);
    }
    if (op % 50000 == 0) {
      for (const auto& [key, slot] : model) ASSERT_EQ(Find(Key(key)), slot);
    }
  }
  ASSERT_EQ(index_.size(), model.size());
  for (const auto& [key, slot] : model) ASSERT_EQ(Find(Key(key)), slot);
  for (uint64_t k = 60000; k < 61000; ++k) ASSERT_EQ(Find(Key(k)), SlotIndex::kNotFound);
  size_t n = 0;
  index_.ForEach([&](uint32_t) { ++n; });
  EXPECT_EQ(n, model.size());
}

TEST_F(SlotIndexTest, GrowsWhenFullAndShrinksWhenEmptied) {
  for (uint32_t i = 0; i < 100000; ++i) Insert(Key(i), i);
  EXPECT_LE(index_.size() * 10, index_.capacity() * 9);
  EXPECT_GE(index_.size() * 10, index_.capacity() * 6);  // not oversized
  for (uint32_t i = 0; i < 100000; ++i) ASSERT_EQ(Find(Key(i)), i);
  for (uint32_t i = 0; i < 99990; ++i) ASSERT_TRUE(index_.Erase(Key(i), i));
  EXPECT_LT(index_.capacity(), 64u);
  for (uint32_t i = 99990; i < 100000; ++i) ASSERT_EQ(Find(Key(i)), i);
}

}  // namespace
}  // namespace kvpool::dram
