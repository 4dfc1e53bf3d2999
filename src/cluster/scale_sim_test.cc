// ScaleSim's small cases (N <= 16) run in make test: real cluster services
// in one process, and exact counts of what a 128-block chain's put and read
// send, against what the shard map says they must send.
#include "cluster/scale_sim.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace kvpool::cluster {
namespace {

std::vector<KeyId> Chain(int c, int blocks) {
  std::vector<KeyId> keys;
  for (int b = 0; b < blocks; ++b) {
    keys.push_back(MakeKeyId("scale-sim", "c" + std::to_string(c) + "-b" + std::to_string(b)));
  }
  return keys;
}

// Homes of keys other than `self`.
std::set<std::string> RemoteHomes(const ShardMap& map, const std::vector<KeyId>& keys,
                                  const std::string& self) {
  std::set<std::string> homes;
  for (const KeyId& k : keys) {
    const Member* h = map.HomeOf(k);
    if (h != nullptr && h->node_id != self) homes.insert(h->node_id);
  }
  return homes;
}

class ScaleSimTest : public ::testing::TestWithParam<size_t> {};

// A chain's put sends one publish per remote home; its read from another
// node sends one lookup per remote home and one fetch per block, and
// returns every block byte-exact. Keys no node holds are misses that cost
// their lookups only.
TEST_P(ScaleSimTest, AChainCostsOneLookupPerHomeAndOneFetchPerBlock) {
  const size_t n = GetParam();
  ScaleSimOptions o;
  o.nodes = n;
  o.threads = 2;
  auto sim = ScaleSim::Open(o);
  ASSERT_TRUE(sim.ok()) << sim.status().ToString();
  ScaleSim& s = **sim;
  const auto map = s.shard_map();
  for (int c = 0; c < 3; ++c) {
    const auto keys = Chain(c, 128);
    const size_t writer = static_cast<size_t>(c) % n;
    const size_t reader = (writer + 1) % n;
    RequestCost put;
    ASSERT_TRUE(s.Put(writer, keys, 1024, &put).ok());
    EXPECT_EQ(put.publishes, RemoteHomes(*map, keys, s.node_id(writer)).size()) << c;
    EXPECT_EQ(put.homes, put.publishes);
    EXPECT_EQ(put.lookups + put.fetches, 0u);
    size_t found = 0;
    RequestCost read;
    ASSERT_TRUE(s.Read(reader, keys, &found, &read).ok());
    EXPECT_EQ(found, 128u) << c;
    EXPECT_EQ(read.lookups, RemoteHomes(*map, keys, s.node_id(reader)).size()) << c;
    EXPECT_EQ(read.homes, read.lookups);
    EXPECT_EQ(read.fetches, 128u);
    EXPECT_EQ(read.messages, read.lookups + read.fetches);
  }
  EXPECT_EQ(s.directory_entries(), 3u * 128);
  const auto missing = Chain(99, 32);
  size_t found = 7;
  RequestCost miss;
  ASSERT_TRUE(s.Read(0, missing, &found, &miss).ok());
  EXPECT_EQ(found, 0u);
  EXPECT_EQ(miss.fetches, 0u);
  EXPECT_EQ(miss.lookups, RemoteHomes(*map, missing, s.node_id(0)).size());
  // Every node keeps the whole membership: it grows with n.
  EXPECT_GE(s.membership_bytes(0), n * 2 * sizeof(Member));
}

INSTANTIATE_TEST_SUITE_P(Nodes, ScaleSimTest, ::testing::Values(4, 16));

// A member joining moves about its fair share of the 4096 shards
// (rendezvous hashing): near 1.0 of the ideal at small N. (Leaving moves
// the same shards back.)
TEST(ScaleSimShardsTest, AJoinMovesAboutOneMembersShare) {
  for (size_t n : {4, 16}) {
    uint64_t moved = 0;
    const double join = ShardsMovedVsIdeal(n, /*leave=*/false, &moved);
    EXPECT_GT(moved, 0u);
    EXPECT_LT(join, 1.3) << n;
    EXPECT_GT(join, 0.7) << n;
  }
}

}  // namespace
}  // namespace kvpool::cluster
