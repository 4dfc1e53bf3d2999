// The frequency sketch: exact counts where keys do not collide, never
// under a key's true count where they do, saturation and halving.
#include "store/dram/frequency_sketch.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvpool::dram {
namespace {

KeyId K(uint64_t k) { return KeyId{k * 0x9e3779b97f4a7c15ull + 3, k << 32 | 7}; }

TEST(FrequencySketchTest, CountsEachKeyAndNeverUnderCounts) {
  // 100 keys in 64 Ki counters: each key's count exactly (no key shares
  // all four counters with another).
  FrequencySketch roomy(1 << 16, 1 << 30);
  for (uint64_t k = 0; k < 100; ++k) {
    for (uint64_t i = 0; i < k % 10; ++i) roomy.Increment(K(k));
  }
  for (uint64_t k = 0; k < 100; ++k) EXPECT_EQ(roomy.Estimate(K(k)), k % 10) << k;
  EXPECT_EQ(roomy.Estimate(K(1000)), 0u);

  // 2,000 keys in 64 counters: collisions raise estimates, never lower them.
  FrequencySketch tight(64, 1 << 30);
  std::vector<uint32_t> truth(2000);
  for (uint64_t k = 0; k < 2000; ++k) {
    for (uint64_t i = 0; i < k % 3; ++i) tight.Increment(K(k));
    truth[k] = k % 3;
  }
  uint64_t over = 0;
  for (uint64_t k = 0; k < 2000; ++k) {
    ASSERT_GE(tight.Estimate(K(k)), std::min<uint32_t>(truth[k], FrequencySketch::kMax)) << k;
    over += tight.Estimate(K(k)) > truth[k];
  }
  EXPECT_GT(over, 0u);  // the negative control: they did collide
}

TEST(FrequencySketchTest, SaturatesAndHalves) {
  FrequencySketch s(1 << 12, 100);
  for (int i = 0; i < 40; ++i) s.Increment(K(1));
  EXPECT_EQ(s.Estimate(K(1)), 15u);  // saturated
  EXPECT_EQ(s.halvings(), 0u);
  for (int i = 0; i < 7; ++i) s.Increment(K(2));
  EXPECT_EQ(s.Estimate(K(2)), 7u);
  // 53 more increments make 100: every counter halves (15 -> 7, 7 -> 3,
  // and key 3's 53 saturated at 15 -> 7).
  for (int i = 0; i < 53; ++i) s.Increment(K(3));
  EXPECT_EQ(s.halvings(), 1u);
  EXPECT_EQ(s.Estimate(K(1)), 7u);
  EXPECT_EQ(s.Estimate(K(2)), 3u);
  EXPECT_EQ(s.Estimate(K(3)), 7u);
  // Resize forgets.
  s.Resize(1 << 12, 100);
  EXPECT_EQ(s.Estimate(K(1)), 0u);
  EXPECT_EQ(s.counters(), 4096u);
}

}  // namespace
}  // namespace kvpool::dram
