#include "store/ssd/ssd_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace kvpool::ssd {
namespace {

TEST(SsdIndexTest, MatchesAMapUnderRandomInsertEraseAndGrowth) {
  SsdIndex idx(16);
  std::unordered_map<uint64_t, IndexLoc> ref;
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys;
  for (int step = 0; step < 200000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op < 2 || keys.empty()) {
      uint64_t h = rng();
      IndexLoc loc{static_cast<uint32_t>(rng() % 1000), (rng() % 100000) * 64,
                   static_cast<uint32_t>(rng()), 0};
      ASSERT_EQ(idx.Insert(h, loc), ref.emplace(h, loc).second);
      keys.push_back(h);
    } else {
      size_t i = rng() % keys.size();
      ASSERT_EQ(idx.Erase(keys[i]), ref.erase(keys[i]) == 1);
      keys[i] = keys.back();
      keys.pop_back();
    }
  }
  ASSERT_EQ(idx.size(), ref.size());
  for (const auto& [h, loc] : ref) {
    IndexLoc got;
    ASSERT_TRUE(idx.Find(h, &got));
    EXPECT_EQ(got.region, loc.region);
    EXPECT_EQ(got.offset, loc.offset);
    EXPECT_EQ(got.length, loc.length);
  }
  EXPECT_LE(static_cast<double>(idx.size()), SsdIndex::kMaxLoad * idx.slots());
}

TEST(SsdIndexTest, ConditionalEraseAndReads) {
  SsdIndex idx;
  ASSERT_TRUE(idx.Insert(42, {7, 128, 1000, 0}));
  EXPECT_FALSE(idx.Insert(42, {8, 0, 1, 0}));
  EXPECT_FALSE(idx.EraseIfIn(42, 8));
  EXPECT_FALSE(idx.EraseIfAt(42, 7, 64));
  for (int i = 0; i < 300; ++i) idx.BumpReads(42);
  IndexLoc loc;
  ASSERT_TRUE(idx.Find(42, &loc));
  EXPECT_EQ(loc.reads, SsdIndex::kMaxReads);
  EXPECT_EQ(loc.offset, 128u);
  EXPECT_TRUE(idx.EraseIfAt(42, 7, 128));
  EXPECT_FALSE(idx.Find(42, &loc));
}

TEST(SsdIndexTest, SixteenBytesPerSlot) {
  SsdIndex idx(1 << 16);
  EXPECT_EQ(idx.bytes(), (1u << 16) * 16u);
  // At the highest load the table allows: 16 / 0.8 = 20 bytes per entry.
  EXPECT_LE(idx.bytes() / (SsdIndex::kMaxLoad * idx.slots()), 20.0 + 1e-9);
}

}  // namespace
}  // namespace kvpool::ssd
