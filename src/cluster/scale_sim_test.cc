// ScaleSim's small cases (N <= 16) run in make test: real cluster services
// in one process, and exact counts of what a 128-block chain's put and read
// send, against what the shard map says they must send.
#include "cluster/scale_sim.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "peer/peer_messages_format.h"

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

// A simulation of `nodes` nodes on 2 threads; null (a test failure) when it
// cannot open.
std::unique_ptr<ScaleSim> OpenSim(size_t nodes, bool chain_reads = false) {
  ScaleSimOptions o;
  o.nodes = nodes;
  o.threads = 2;
  o.chain_reads = chain_reads;
  auto sim = ScaleSim::Open(o);
  EXPECT_TRUE(sim.ok()) << sim.status().ToString();
  return sim.ok() ? std::move(sim).value() : nullptr;
}

class ScaleSimTest : public ::testing::TestWithParam<size_t> {};

// A chain's put sends one publish per remote home; its read from another
// node sends one lookup per remote home and one fetch per block, and
// returns every block byte-exact. Keys no node holds are misses that cost
// their lookups only.
TEST_P(ScaleSimTest, AChainCostsOneLookupPerHomeAndOneFetchPerBlock) {
  const size_t n = GetParam();
  auto sim = OpenSim(n);
  ASSERT_NE(sim, nullptr);
  ScaleSim& s = *sim;
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

// Chain reads: a chain held by one node costs the first key's lookup at
// its home (none when the reader is that home), one holder lookup and a
// fetch per block, at any N. A chain whose second half another node holds
// costs, on top, the lookups of that half at its homes. A chain nobody
// holds costs the first key's lookup and the rest's at their homes.
TEST_P(ScaleSimTest, AChainReadAsksTheFirstKeysHomeAndThenItsHolder) {
  const size_t n = GetParam();
  auto sim = OpenSim(n, /*chain_reads=*/true);
  ASSERT_NE(sim, nullptr);
  ScaleSim& s = *sim;
  const auto map = s.shard_map();
  for (int c = 0; c < 4; ++c) {
    const auto keys = Chain(c, 128);
    const size_t writer = static_cast<size_t>(c) % n;
    const size_t reader = (writer + 1) % n;
    ASSERT_TRUE(s.Put(writer, keys, 1024, nullptr).ok());
    size_t found = 0;
    RequestCost read;
    ASSERT_TRUE(s.Read(reader, keys, &found, &read).ok());
    EXPECT_EQ(found, 128u) << c;
    EXPECT_EQ(read.lookups, RemoteHomes(*map, {keys[0]}, s.node_id(reader)).size()) << c;
    EXPECT_EQ(read.holder_lookups, 1u) << c;
    EXPECT_EQ(read.fetches, 128u);
    EXPECT_EQ(read.messages, read.lookups + 1 + 128);
  }
  // Split over two holders: the half the first key's holder lacks is
  // looked up at its homes.
  const auto split = Chain(50, 128);
  const std::vector<KeyId> first(split.begin(), split.begin() + 64);
  const std::vector<KeyId> second(split.begin() + 64, split.end());
  ASSERT_TRUE(s.Put(0, first, 1024, nullptr).ok());
  ASSERT_TRUE(s.Put(1, second, 1024, nullptr).ok());
  size_t found = 0;
  RequestCost read;
  ASSERT_TRUE(s.Read(2, split, &found, &read).ok());
  EXPECT_EQ(found, 128u);
  EXPECT_EQ(read.holder_lookups, 1u);
  // The first key's home, then the second half's homes (one call per home
  // and round: a home of both counts twice).
  const size_t first_home = RemoteHomes(*map, {split[0]}, s.node_id(2)).size();
  EXPECT_EQ(read.lookups, first_home + RemoteHomes(*map, second, s.node_id(2)).size());
  EXPECT_EQ(read.fetches, 128u);
  // Held nowhere.
  const auto missing = Chain(99, 32);
  RequestCost miss;
  found = 7;
  ASSERT_TRUE(s.Read(0, missing, &found, &miss).ok());
  EXPECT_EQ(found, 0u);
  EXPECT_EQ(miss.holder_lookups, 0u);
  EXPECT_EQ(miss.fetches, 0u);
  const std::vector<KeyId> rest(missing.begin() + 1, missing.end());
  EXPECT_EQ(miss.lookups, RemoteHomes(*map, {missing[0]}, s.node_id(0)).size() +
                              RemoteHomes(*map, rest, s.node_id(0)).size());
}

INSTANTIATE_TEST_SUITE_P(Nodes, ScaleSimTest, ::testing::Values(4, 16));

// The latency model replays a call graph: calls sent from the request's
// start go out together (after each one's send cost at the sender), a call
// sent from another's reply waits for it, a node handles one message at a
// time, and the bytes queue on a node's link out.
TEST(ScaleSimLatencyTest, AReplayWaitsForParentsAndQueuesAtNodes) {
  auto sim = OpenSim(4);
  ASSERT_NE(sim, nullptr);
  ScaleSim& s = *sim;
  // Measure some real costs first.
  const auto keys = Chain(7, 16);
  ASSERT_TRUE(s.Put(0, keys, 1024, nullptr).ok());
  size_t found = 0;
  RequestCost read;
  ASSERT_TRUE(s.Read(1, keys, &found, &read).ok());
  ASSERT_EQ(found, 16u);
  const SimCostTable costs = s.costs();
  const double send = costs.Send(kPeerLookup), handle = costs.Handler(kPeerLookup);
  ASSERT_GT(handle, 0);
  LinkModel link;
  link.latency_us = 10;
  link.gbit = 8;  // 1,000 bytes per microsecond
  link.jitter = 0;
  link.slow_every = 0;
  auto lookup = [](int parent, uint32_t to) {
    SimCall c;
    c.parent = parent;
    c.from = 0;
    c.to = to;
    c.type = kPeerLookup;
    return c;
  };
  const double one = send + 10 + handle + 10;
  EXPECT_DOUBLE_EQ(ScaleSim::LatencyUs({lookup(-1, 1)}, link, costs, 1), one);
  // Two at once to two nodes: the second waits for the first's send only.
  EXPECT_DOUBLE_EQ(ScaleSim::LatencyUs({lookup(-1, 1), lookup(-1, 2)}, link, costs, 1), one + send);
  // One after the other's reply.
  EXPECT_DOUBLE_EQ(ScaleSim::LatencyUs({lookup(-1, 1), lookup(0, 2)}, link, costs, 1), 2 * one);
  // Two at once to one node: it handles them in turn.
  EXPECT_NEAR(ScaleSim::LatencyUs({lookup(-1, 1), lookup(-1, 1)}, link, costs, 1),
              std::max(one + send, one + handle), 1e-9);
  // A 5,000-byte reply takes 5 microseconds on the wire.
  SimCall big = lookup(-1, 1);
  big.reply_bytes = 5000;
  EXPECT_DOUBLE_EQ(ScaleSim::LatencyUs({big}, link, costs, 1), one + 5);
  // Jitter only adds, and a draw is repeatable.
  link.jitter = 0.1;
  link.slow_every = 10;
  const double a = ScaleSim::LatencyUs({lookup(-1, 1), lookup(0, 2)}, link, costs, 42);
  EXPECT_GE(a, 2 * one);
  EXPECT_EQ(a, ScaleSim::LatencyUs({lookup(-1, 1), lookup(0, 2)}, link, costs, 42));
}

// A join and a crash on a running simulation: the shards that move are the
// shard maps' difference, every key whose home moved is listed at its new
// home again, reads find every key still held, byte-exact, and the keys
// only the crashed node held are lost (misses).
TEST(ScaleSimViewTest, AJoinAndACrashLeaveTheDirectoryWholeAgain) {
  auto sim = OpenSim(8);
  ASSERT_NE(sim, nullptr);
  ScaleSim& s = *sim;
  std::vector<std::vector<KeyId>> put;
  for (int w = 0; w < 8; ++w) {
    put.push_back(Chain(100 + w, 64));
    ASSERT_TRUE(s.Put(static_cast<size_t>(w), put.back(), 512, nullptr).ok());
  }
  uint64_t ideal_moved = 0;
  ShardsMovedVsIdeal(8, /*leave=*/false, &ideal_moved);
  ScaleSim::ViewChange join;
  ASSERT_TRUE(s.Join(&join).ok());
  EXPECT_EQ(join.shards_moved, ideal_moved);  // the same members, the same maps
  EXPECT_GT(join.keys_moved, 0u);
  EXPECT_EQ(join.keys_lost, 0u);
  EXPECT_GE(join.whole_s, 0);
  EXPECT_EQ(s.size(), 9u);
  // Read through the new node: every key, from its holder.
  for (int w = 0; w < 8; ++w) {
    size_t found = 0;
    ASSERT_TRUE(s.Read(8, ScaleSim::ReadKind::kHomes, put[w], &found, nullptr).ok());
    EXPECT_EQ(found, 64u) << w;
  }
  ScaleSim::ViewChange leave;
  ASSERT_TRUE(s.Leave(3, &leave).ok());
  EXPECT_GT(leave.shards_moved, 0u);
  EXPECT_EQ(leave.keys_lost, 64u);
  EXPECT_GE(leave.whole_s, 0);
  for (int w = 0; w < 8; ++w) {
    size_t found = 0;
    ASSERT_TRUE(s.Read(w == 0 ? 1 : 0, ScaleSim::ReadKind::kHomes, put[w], &found, nullptr).ok());
    EXPECT_EQ(found, w == 3 ? 0u : 64u) << w;
  }
  EXPECT_FALSE(s.Leave(3, nullptr).ok());
}

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
