// The shadow caches that choose the prefix policy's protected share, on
// hand-made traffic: each choice moves the way the traffic says, and the
// sampling, the shadows' size and the choice stay within their bounds.
#include "store/dram/shadow_shares.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kvpool::dram {
namespace {

KeyId K(uint64_t k) { return KeyId{k * 0x9e3779b97f4a7c15ull + 1, k}; }

// With max_rate 1 and a capacity of 100 entries every key is sampled and
// each shadow holds 100 keys, as the store would.
ShadowShares Full() {
  ShadowShares s(/*max_rate=*/1.0);
  s.SetCapacityEntries(100);
  EXPECT_EQ(s.rate(), 1.0);
  EXPECT_EQ(s.shadow_capacity(), 100u);
  return s;
}

// A conversation: each step a new block enters and the block that entered
// 40 steps earlier is read again, once (79 other blocks are used in
// between, so an LRU of 100 keeps it). A block read once is protected and
// never read again, so at 70 % protected fills with stale blocks and the
// rest cannot keep a block for 40 steps; with no protected list all 100
// can.
void Conversation(ShadowShares& s, uint64_t from, uint64_t steps) {
  for (uint64_t t = from; t < from + steps; ++t) {
    s.Insert(K(t), ShadowShares::Place::kWarm, false);
    if (t >= from + 40) s.Touch(K(t - 40));
  }
}

// A hot set of 60 blocks read in turn between one-off blocks: two new
// blocks per hot read, so between two reads of one hot block 120 new ones
// pass. A protected list of P keeps the P hot blocks read last; the one it
// lets go is the next to be read, 60 - P steps later, while probation's
// 100 - P entries turn over at 3 per step: only P > 40 keeps it.
void HotSetAndScan(ShadowShares& s, uint64_t from, uint64_t steps) {
  for (uint64_t t = 0; t < steps; ++t) {
    s.Touch(K(1'000'000 + t % 60));
    s.Insert(K(from + 2 * t), ShadowShares::Place::kWarm, false);
    s.Insert(K(from + 2 * t + 1), ShadowShares::Place::kWarm, false);
  }
}

TEST(ShadowSharesTest, StartsAtTheTunedShare) {
  ShadowShares s = Full();
  EXPECT_EQ(s.share_tenths(), 7);
  EXPECT_EQ(s.chosen(), ShadowShares::kStart);
  EXPECT_EQ(s.changes(), 0u);
}

TEST(ShadowSharesTest, AConversationMovesTheShareDown) {
  ShadowShares s = Full();
  Conversation(s, 0, 20'000);
  EXPECT_EQ(s.share_tenths(), 0);
  EXPECT_EQ(s.changes(), 1u);  // straight there, and it stays
  const auto r = s.hit_ratios();
  // Shadow 0 (no protected list) hits every read; at 70 % none.
  EXPECT_GT(r[0], 0.45);
  EXPECT_LT(r[3], 0.01);
}

TEST(ShadowSharesTest, AHotSetUnderAScanMovesItBackUp) {
  ShadowShares s = Full();
  Conversation(s, 0, 20'000);
  ASSERT_EQ(s.share_tenths(), 0);
  HotSetAndScan(s, 100'000, 20'000);
  // 50 and 70 % keep the hot set; 0 and 30 % lose it.
  const auto r = s.hit_ratios();
  EXPECT_GE(s.share_tenths(), 5) << r[0] << " " << r[1] << " " << r[2] << " " << r[3];
  EXPECT_GT(r[2], 0.3);
  EXPECT_LT(r[0], 0.01);
}

// A loop of 150 keys read in turn, larger than the shadows' 100: an LRU
// (any warm-inserting share) lets each key go before its turn comes round,
// so every access misses there; bimodal insertion keeps what it holds and
// lets only one in kBimodalEvery of the new keys in, so most of its keys
// are there at their next turn.
void Loop(ShadowShares& s, uint64_t from, uint64_t passes) {
  for (uint64_t t = 0; t < passes * 150; ++t) {
    s.Insert(K(from + t % 150), ShadowShares::Place::kWarm, false);
  }
}

TEST(ShadowSharesTest, ALoopLargerThanTheCacheMovesToBimodalInsertion) {
  ShadowShares s = Full();
  ASSERT_FALSE(s.bimodal());
  ASSERT_EQ(ShadowShares::kShareTenths[4], 7);
  ASSERT_TRUE(ShadowShares::kBimodal[4]);
  Loop(s, 0, 200);
  const auto r = s.hit_ratios();
  EXPECT_TRUE(s.bimodal());
  EXPECT_EQ(s.chosen(), 4u);
  EXPECT_EQ(s.share_tenths(), 7);
  EXPECT_EQ(s.changes(), 1u);  // straight there, and it stays
  // Most of the 100 keys it holds are there at their turn (the counts of
  // the first passes still weigh in the decayed ratio).
  EXPECT_GT(r[4], 0.4) << r[4];
  for (size_t i = 0; i < 4; ++i) EXPECT_LT(r[i], 0.01) << i << " " << r[i];

  // A conversation moves it to 0 (warm insertion) again.
  Conversation(s, 1'000'000, 20'000);
  EXPECT_FALSE(s.bimodal());
  EXPECT_EQ(s.share_tenths(), 0);
  EXPECT_EQ(s.changes(), 2u);
}

TEST(ShadowSharesTest, TrafficWithNoHitsLeavesTheShareAlone) {
  ShadowShares s = Full();
  for (uint64_t t = 0; t < 50'000; ++t) s.Insert(K(t), ShadowShares::Place::kWarm, false);
  EXPECT_EQ(s.share_tenths(), 7);
  EXPECT_EQ(s.changes(), 0u);
  EXPECT_GT(s.windows(), 10u);
}

TEST(ShadowSharesTest, TheChoiceNeedsAClearMargin) {
  // A hot set that every share keeps (20 blocks, read in turn, new blocks
  // between): all shadows hit alike, and the share stays where it is.
  ShadowShares s = Full();
  for (uint64_t t = 0; t < 50'000; ++t) {
    s.Touch(K(1'000'000 + t % 20));
    if (t % 4 == 0) s.Insert(K(t), ShadowShares::Place::kWarm, false);
  }
  EXPECT_EQ(s.share_tenths(), 7);
  EXPECT_EQ(s.changes(), 0u);
}

TEST(ShadowSharesTest, SamplingFollowsTheRateAndTheShadowsStayBounded) {
  constexpr uint64_t kEntries = 1'000'000;
  ShadowShares s;
  s.SetCapacityEntries(kEntries);
  const double want = static_cast<double>(ShadowShares::kShadowEntries) / kEntries;
  EXPECT_DOUBLE_EQ(s.rate(), want);
  EXPECT_EQ(s.shadow_capacity(), ShadowShares::kShadowEntries);
  std::mt19937_64 rng(7);
  uint64_t sampled = 0;
  constexpr uint64_t kKeys = 2'000'000;
  for (uint64_t i = 0; i < kKeys; ++i) {
    const KeyId key{rng(), rng()};
    if (!s.Sampled(key)) continue;
    ++sampled;
    s.Insert(key, ShadowShares::Place::kWarm, false);
  }
  const double got = static_cast<double>(sampled) / kKeys;
  EXPECT_NEAR(got, want, want * 0.1);
  // 8,000-odd distinct keys passed, none twice: each shadow holds its
  // capacity. The warm ones hold the same keys, the last ones, but for the
  // odd ghost false hit that protects a new key in all of them and that the
  // shares then order apart; the bimodal one mostly the first ones.
  EXPECT_GE(s.keys(), ShadowShares::kShadowEntries);
  EXPECT_LE(s.keys(), 2 * ShadowShares::kShadowEntries + 16);

  // A mid-sized store: the rate is capped (max_rate), not the shadows' size.
  ShadowShares mid;
  mid.SetCapacityEntries(4000);
  EXPECT_DOUBLE_EQ(mid.rate(), ShadowShares::kMaxRate);
  EXPECT_EQ(mid.shadow_capacity(), 500u);
  // A small store: each shadow still holds kMinShadowEntries keys, or all.
  ShadowShares small;
  small.SetCapacityEntries(1000);
  EXPECT_DOUBLE_EQ(small.rate(), 0.256);
  EXPECT_EQ(small.shadow_capacity(), ShadowShares::kMinShadowEntries);
  ShadowShares tiny;
  tiny.SetCapacityEntries(100);
  EXPECT_DOUBLE_EQ(tiny.rate(), 1.0);
  EXPECT_EQ(tiny.shadow_capacity(), 100u);
}

TEST(ShadowSharesTest, ACapacityChangeResamplesOnlyWhenTheRateMoves) {
  ShadowShares s(1.0);
  s.SetCapacityEntries(100'000);
  for (uint64_t t = 0; t < 200'000; ++t) {
    if (s.Sampled(K(t))) s.Insert(K(t), ShadowShares::Place::kWarm, false);
  }
  const uint64_t held = s.keys();
  ASSERT_GT(held, 0u);
  s.SetCapacityEntries(110'000);  // the rate moves by a tenth: kept
  EXPECT_EQ(s.keys(), held);
  s.SetCapacityEntries(50'000);  // it doubles: afresh
  EXPECT_EQ(s.keys(), 0u);
  EXPECT_EQ(s.share_tenths(), 7);
}

// Within a chain, an entry placed kInChain goes just colder than the
// chain's previous sampled entry, so the chain leaves from its tail, in
// every shadow: at a share of 0 the shadow is an LRU of chains, as the
// policy is there.
TEST(ShadowSharesTest, AChainLeavesTheShadowFromItsTail) {
  ShadowShares s = Full();
  ASSERT_EQ(ShadowShares::kShareTenths[0], 0);
  // 100 blocks as 10 chains of 10.
  for (uint64_t c = 0; c < 10; ++c) {
    for (uint64_t b = 0; b < 10; ++b) {
      s.Insert(K(c * 10 + b), b == 0 ? ShadowShares::Place::kWarm : ShadowShares::Place::kInChain,
               false);
    }
  }
  // 5 new chain heads push out 5 entries: chain 0's tail (probation's cold
  // end holds chain 0 with its head warmest), so blocks 5..9 go.
  for (uint64_t b = 0; b < 5; ++b) s.Insert(K(500 + b), ShadowShares::Place::kWarm, false);
  auto read = [](ShadowShares copy, uint64_t from) {
    const auto before = copy.hit_ratios();
    for (uint64_t b = from; b < from + 5; ++b) copy.Touch(K(b));
    const auto after = copy.hit_ratios();
    std::string rose;
    for (size_t i = 0; i < ShadowShares::kCandidates; ++i) rose += after[i] > before[i] ? '1' : '0';
    return rose;
  };
  // Which shadows hit the chain's head, and which its tail. The bimodal
  // shadow put the new heads at probation's cold end, where each went at
  // the next one's insert (and chain 9's tail, the coldest, at the first):
  // it still holds chain 0 whole.
  EXPECT_EQ(read(s, 0), "11111");
  EXPECT_EQ(read(s, 5), "00001");
}

// 100 blocks as 10 chains of 10, then 5 new chain heads: every warm
// shadow holds chains 1..9 and chain 0's blocks 0..4, and none holds 5..9;
// the bimodal one holds all of chains 0..8 (AChainLeavesTheShadowFromItsTail).
ShadowShares TenChainsAndATail() {
  ShadowShares s = Full();
  for (uint64_t c = 0; c < 10; ++c) {
    for (uint64_t b = 0; b < 10; ++b) {
      s.Insert(K(c * 10 + b), b == 0 ? ShadowShares::Place::kWarm : ShadowShares::Place::kInChain,
               false);
    }
  }
  for (uint64_t b = 0; b < 5; ++b) s.Insert(K(500 + b), ShadowShares::Place::kWarm, false);
  return s;
}

// The blocks of `keys` read as one batch (a chain from its head), touched
// last to first as the store does: how many of them each shadow counted as
// hits, from its hit ratio before and after (every shadow saw the same
// accesses), and the run the batch left.
std::array<double, ShadowShares::kCandidates> ReadChain(ShadowShares& s,
                                                        const std::vector<uint64_t>& keys,
                                                        uint8_t* run) {
  // The accesses so far, from a probe that shadow 0 hits (a block of
  // chain 9).
  ShadowShares probe = s;
  const auto r0 = probe.hit_ratios();
  probe.Touch(K(99));
  const auto r1 = probe.hit_ratios();
  // h0 = r0 a, h0 + 1 = r1 (a + 1): a = (1 - r1) / (r1 - r0).
  const double accesses = (1 - r1[0]) / (r1[0] - r0[0]);
  const auto before = s.hit_ratios();
  s.BeginHits();
  for (size_t k = keys.size(); k-- > 0;) s.Touch(K(keys[k]));
  s.EndHits(run);
  const auto after = s.hit_ratios();
  std::array<double, ShadowShares::kCandidates> hits{};
  for (size_t i = 0; i < ShadowShares::kCandidates; ++i) {
    hits[i] = std::round(after[i] * (accesses + keys.size()) - before[i] * accesses);
  }
  return hits;
}

// What an engine gains from a read is its leading run of hits: a shadow's
// hit behind its first miss in the chain does not count, and the run the
// read leaves goes on into the chain's writes.
TEST(ShadowSharesTest, AHitBehindAShadowsFirstMissInTheChainDoesNotCount) {
  using Hits = std::array<double, ShadowShares::kCandidates>;
  {
    ShadowShares s = TenChainsAndATail();
    uint8_t run = 0;
    EXPECT_EQ(ReadChain(s, {10, 11, 12, 13}, &run), (Hits{4, 4, 4, 4, 4}));
    EXPECT_EQ(run, ShadowShares::kRunAlive);
  }
  {
    // Chain 0 read past its tail's loss: 0..4 hit, 5 misses in every warm
    // shadow, and 20..21 (held by all) after it count nowhere there. The
    // bimodal shadow (4) holds chain 0 whole: all 8 hit there.
    ShadowShares s = TenChainsAndATail();
    uint8_t run = ShadowShares::kRunAlive;
    EXPECT_EQ(ReadChain(s, {0, 1, 2, 3, 4, 5, 20, 21}, &run), (Hits{5, 5, 5, 5, 8}));
    EXPECT_EQ(run, 1u << 4);
    // The chain's writes that follow go on from that run: a block every
    // shadow holds is not a hit where the run broke, and is one where it
    // did not (the bimodal shadow, and every shadow with the run alive).
    ShadowShares alive = s;
    uint8_t alive_run = ShadowShares::kRunAlive;
    const auto before = s.hit_ratios();
    s.Insert(K(22), ShadowShares::Place::kInChain, false, &run);
    alive.Insert(K(22), ShadowShares::Place::kInChain, false, &alive_run);
    EXPECT_EQ(run, 1u << 4);
    EXPECT_EQ(alive_run, ShadowShares::kRunAlive);
    for (size_t i = 0; i < ShadowShares::kCandidates; ++i) {
      if (i == 4) {
        EXPECT_GT(s.hit_ratios()[i], before[i]) << i;
      } else {
        EXPECT_LT(s.hit_ratios()[i], before[i]) << i;
      }
      EXPECT_GT(alive.hit_ratios()[i], before[i]) << i;
    }
  }
}

}  // namespace
}  // namespace kvpool::dram
