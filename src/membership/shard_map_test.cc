#include "membership/shard_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

namespace kvpool {
namespace {

MembershipView ViewOf(int n, uint64_t epoch = 1) {
  MembershipView v;
  v.epoch = epoch;
  for (int i = 0; i < n; ++i) {
    Member m;
    m.node_id = "node-" + std::to_string(i);
    m.address = "10.0.0." + std::to_string(i) + ":7400";
    m.incarnation = 100 + i;
    v.members.push_back(m);
  }
  return v;
}

TEST(ShardMapTest, ShardOfUsesTopBits) {
  EXPECT_EQ(ShardOf(KeyId{0, 0}), 0u);
  EXPECT_EQ(ShardOf(KeyId{~0ull, 0}), kNumShards - 1);
  EXPECT_EQ(ShardOf(KeyId{1ull << 52, 0}), 1u);
}

TEST(ShardMapTest, EmptyViewHasNoHomes) {
  ShardMap map = ShardMap::Compute(MembershipView{});
  EXPECT_TRUE(map.empty());
  EXPECT_EQ(map.Home(0), nullptr);
  EXPECT_TRUE(map.OwnershipCounts().empty());
}

TEST(ShardMapTest, BalancedWithinTenPercentForThreeToEightNodes) {
  for (int n = 3; n <= 8; ++n) {
    ShardMap map = ShardMap::Compute(ViewOf(n));
    auto counts = map.OwnershipCounts();
    ASSERT_EQ(counts.size(), static_cast<size_t>(n));
    double fair = static_cast<double>(kNumShards) / n;
    uint32_t total = 0;
    for (const auto& [id, c] : counts) {
      EXPECT_GE(c, fair * 0.9) << "n=" << n << " " << id;
      EXPECT_LE(c, fair * 1.1) << "n=" << n << " " << id;
      total += c;
    }
    EXPECT_EQ(total, kNumShards);
  }
}

TEST(ShardMapTest, DeterministicAndIndependentOfMemberOrder) {
  MembershipView v = ViewOf(5);
  ShardMap a = ShardMap::Compute(v);
  std::reverse(v.members.begin(), v.members.end());
  ShardMap b = ShardMap::Compute(v);
  EXPECT_TRUE(ShardMap::Moved(a, b).empty());
  for (uint32_t s = 0; s < kNumShards; s += 97) {
    EXPECT_EQ(a.Home(s)->node_id, b.Home(s)->node_id);
  }
  // A known value pins the hash so a change of it (which would split a
  // mixed-version cluster) does not go unnoticed.
  EXPECT_DOUBLE_EQ(ShardMap::Score("node-0", 1.0, 7), 8.6917060550883161);
  ShardMap three = ShardMap::Compute(ViewOf(3));
  EXPECT_EQ(three.Home(0)->node_id, "node-2");
  EXPECT_EQ(three.Home(4095)->node_id, "node-1");
}

TEST(ShardMapTest, AddingANodeMovesOnlyShardsToIt) {
  for (int n = 3; n <= 7; ++n) {
    ShardMap before = ShardMap::Compute(ViewOf(n));
    ShardMap after = ShardMap::Compute(ViewOf(n + 1, 2));
    std::vector<uint32_t> moved = ShardMap::Moved(before, after);
    const std::string added = "node-" + std::to_string(n);
    for (uint32_t s : moved) EXPECT_EQ(after.Home(s)->node_id, added) << "shard " << s;
    double expect = static_cast<double>(kNumShards) / (n + 1);
    EXPECT_GE(moved.size(), expect * 0.85) << n;
    EXPECT_LE(moved.size(), expect * 1.15) << n;
  }
}

TEST(ShardMapTest, RemovingANodeMovesOnlyItsShards) {
  for (int n = 4; n <= 8; ++n) {
    MembershipView v = ViewOf(n);
    ShardMap before = ShardMap::Compute(v);
    const std::string removed = v.members[1].node_id;
    v.members.erase(v.members.begin() + 1);
    v.epoch = 2;
    ShardMap after = ShardMap::Compute(v);
    std::vector<uint32_t> moved = ShardMap::Moved(before, after);
    for (uint32_t s : moved) EXPECT_EQ(before.Home(s)->node_id, removed);
    EXPECT_EQ(moved.size(), before.OwnershipCounts()[removed]);
  }
}

TEST(ShardMapTest, RestartWithNewIncarnationMovesItsShardsOnly) {
  MembershipView v = ViewOf(4);
  ShardMap before = ShardMap::Compute(v);
  v.members[2].incarnation += 1;
  ShardMap after = ShardMap::Compute(v);
  std::vector<uint32_t> moved = ShardMap::Moved(before, after);
  EXPECT_EQ(moved.size(), before.OwnershipCounts()[v.members[2].node_id]);
  for (uint32_t s : moved) EXPECT_EQ(after.Home(s)->node_id, v.members[2].node_id);
}

TEST(ShardMapTest, WeightsScaleShares) {
  MembershipView v = ViewOf(4);
  v.members[0].weight = 2.0;  // 2 / 5 of the shards
  v.members[3].weight = 0.0;  // none
  auto counts = ShardMap::Compute(v).OwnershipCounts();
  EXPECT_EQ(counts.count("node-3"), 0u);
  EXPECT_NEAR(counts["node-0"], kNumShards * 0.5, kNumShards * 0.5 * 0.1);
  EXPECT_NEAR(counts["node-1"], kNumShards * 0.25, kNumShards * 0.25 * 0.1);
}

}  // namespace
}  // namespace kvpool
