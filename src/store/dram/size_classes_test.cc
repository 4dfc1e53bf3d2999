#include "store/dram/size_classes.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kvpool::dram {
namespace {

bool Has(const std::vector<uint64_t>& v, uint64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(SizeClassesTest, DefaultsKeepPowersOfTwoExact) {
  const auto c = BuildSizeClasses(64, 1.25, 4ull << 20);
  EXPECT_EQ(c.front(), 64u);
  EXPECT_EQ(c.back(), 4ull << 20);
  for (uint64_t p = 64; p <= (4ull << 20); p <<= 1) EXPECT_TRUE(Has(c, p)) << p;
  EXPECT_TRUE(std::is_sorted(c.begin(), c.end()));
  EXPECT_EQ(std::adjacent_find(c.begin(), c.end()), c.end());
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i] % 64, 0u);
    // A slab wastes under 64 bytes per slot at its tail.
    const uint64_t n = (4ull << 20) / c[i];
    EXPECT_LT((4ull << 20) - n * c[i], 64 * n);
    // Where a slab holds many slots, classes step by ~the growth factor
    // (widening adds under 1/64, rounding 64 bytes).
    if (i > 0 && n >= 64) {
      EXPECT_LE(c[i], c[i - 1] * 1.25 * (1 + 1.0 / 64) + 64) << c[i];
    }
  }
  EXPECT_LT(c.size(), 80u);
}

TEST(SizeClassesTest, MinClassRoundsUpAndSlabNotPowerOfTwo) {
  const auto c = BuildSizeClasses(100, 2.0, 3ull << 20);
  EXPECT_EQ(c.front(), 128u);
  EXPECT_EQ(c.back(), 3ull << 20);
  EXPECT_TRUE(Has(c, 1ull << 20));  // 3 per slab, exactly
  EXPECT_TRUE(Has(c, 64ull << 10));
}

}  // namespace
}  // namespace kvpool::dram
