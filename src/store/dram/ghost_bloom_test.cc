// The ghost's memory: how long a key is remembered, and how often a key
// never evicted is taken for one.
#include "store/dram/ghost_bloom.h"

#include <gtest/gtest.h>

#include "store/dram/dram_test_util.h"

namespace kvpool::dram {
namespace {

using testing::Key;

TEST(GhostBloomTest, AKeyIsRememberedForOneToTwoWindows) {
  GhostBloom g(1000);
  g.Insert(Key(0));
  EXPECT_TRUE(g.Contains(Key(0)));
  // 998 more: the first window is not full yet.
  for (uint64_t k = 1; k < 999; ++k) g.Insert(Key(k));
  EXPECT_TRUE(g.Contains(Key(0)));
  g.Insert(Key(999));  // the window is full: it becomes the previous one
  EXPECT_TRUE(g.Contains(Key(0)));
  for (uint64_t k = 1000; k < 1999; ++k) g.Insert(Key(k));
  EXPECT_TRUE(g.Contains(Key(0)));  // still in the previous window
  EXPECT_TRUE(g.Contains(Key(1500)));
  g.Insert(Key(1999));  // second rotation: key 0's window is dropped
  EXPECT_FALSE(g.Contains(Key(0)));
  EXPECT_TRUE(g.Contains(Key(1500)));
  EXPECT_TRUE(g.Contains(Key(1999)));
}

TEST(GhostBloomTest, FewKeysNeverInsertedAreTakenForRemembered) {
  GhostBloom g(10000);
  for (uint64_t k = 0; k < 19999; ++k) g.Insert(Key(k));  // both filters full
  uint64_t remembered = 0;
  for (uint64_t k = 0; k < 19999; ++k) remembered += g.Contains(Key(k));
  EXPECT_EQ(remembered, 19999u);
  uint64_t false_hits = 0;
  for (uint64_t k = 1000000; k < 1100000; ++k) false_hits += g.Contains(Key(k));
  // Two filters of 16 bits per key and 11 probes: ~0.05 % each.
  EXPECT_LT(false_hits, 200u) << false_hits;
}

TEST(GhostBloomTest, ResizeForgetsAndTakesTheNewWindow) {
  GhostBloom g(10);
  g.Insert(Key(1));
  g.Resize(100);
  EXPECT_EQ(g.window(), 100u);
  EXPECT_FALSE(g.Contains(Key(1)));
  for (uint64_t k = 0; k < 150; ++k) g.Insert(Key(k));
  EXPECT_TRUE(g.Contains(Key(0)));
  EXPECT_GT(g.bytes(), 2 * 100 * 16 / 8 - 1);
}

}  // namespace
}  // namespace kvpool::dram
