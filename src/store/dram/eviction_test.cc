// Eviction order of the prefix policy, S3-FIFO and LRU, scan resistance,
// and pins under churn.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "store/dram/dram_store.h"
#include "store/dram/dram_test_util.h"
#include "store/dram/shadow_shares.h"

namespace kvpool::dram {
namespace {

using testing::CheckPattern;
using testing::Get;
using testing::Key;
using testing::Put;
using testing::SmallOptions;

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr uint64_t kValue = 64 * KiB;  // 16 MiB / 64 KiB = 256 slots, small queue target 25

std::unique_ptr<DramStore> Open(const char* policy) {
  DramOptions o = SmallOptions(16 * MiB, 1 * MiB);
  o.eviction = policy;
  auto s = DramStore::Open(o, nullptr);
  KVPOOL_CHECK(s.ok());
  return std::move(s).value();
}

void Touch(DramStore& store, uint64_t k) { ASSERT_TRUE(store.Acquire(Key(k)).ok()) << k; }

TEST(S3FifoTest, UnaccessedNewEntriesLeaveFirstAccessedOnesArePromoted) {
  auto store = Open("s3fifo");
  for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 0; k < 100; ++k) Touch(*store, k);
  // 300 new keys: the small queue's head is 0..99 (accessed: promoted to
  // main), then 100..255 and the first new ones (evicted in FIFO order).
  for (uint64_t k = 256; k < 556; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 0; k < 556; ++k) {
    const bool expect = k < 100 || k >= 400;
    ASSERT_EQ(store->Contains(Key(k)), expect) << k;
  }
  EXPECT_EQ(store->GetStats().evictions, 300u);
  EXPECT_EQ(store->GetStats().entries, 256u);
}

TEST(S3FifoTest, GhostHitGoesStraightToMain) {
  auto store = Open("s3fifo");
  for (uint64_t k = 0; k < 300; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  ASSERT_FALSE(store->Contains(Key(0)));  // evicted from small: remembered in the ghost
  ASSERT_TRUE(Put(*store, Key(0), kValue).ok());  // -> main
  ASSERT_TRUE(Put(*store, Key(1000), kValue).ok());  // not in the ghost -> small
  // 300 more new keys flush the small queue (key 1000 with it) while key 0
  // sits in main.
  for (uint64_t k = 2000; k < 2300; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  EXPECT_TRUE(store->Contains(Key(0)));
  EXPECT_FALSE(store->Contains(Key(1000)));
}

// The prefix policy (256 slots of 64 KiB; protected holds at most 179).

// Puts keys [lo, hi) as one chain: each committed just after the one before.
void PutChain(DramStore& store, uint64_t lo, uint64_t hi) {
  DramStore::ChainPlace chain;
  for (uint64_t k = lo; k < hi; ++k) {
    auto r = store.Reserve(Key(k), kValue);
    ASSERT_TRUE(r.ok()) << k;
    ASSERT_TRUE(store.Commit(std::move(r).value(), &chain).ok()) << k;
  }
}

// The shadows judge a chain by its leading run (shadow_shares.h): a read
// of a chain reports where the run stands at its end (all shadows still
// hitting), and the chain's writes carry it on (ChainPlace::run) until a
// block every shadow misses ends it. A 256-slot store samples every key.
TEST(PrefixPolicyTest, AReadsRunGoesOnIntoTheChainsWrites) {
  auto store = Open("prefix");
  ASSERT_EQ(store->GetStats().eviction.sample_rate, 1.0);
  DramStore::ChainPlace chain;
  EXPECT_EQ(chain.run, UINT8_MAX);
  for (uint64_t k = 0; k < 4; ++k) {
    auto r = store->Reserve(Key(k), kValue);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
    EXPECT_EQ(chain.run, 0) << k;  // a new block: every shadow missed it
  }
  std::vector<KeyId> keys = {Key(0), Key(1), Key(2), Key(3)};
  std::vector<DramStore::Pin> pins(keys.size());
  uint8_t run = 0;
  EXPECT_EQ(store->AcquireBatch(keys, pins, &run), 4u);
  EXPECT_EQ(run, ShadowShares::kRunAlive);  // every shadow holds the chain
  pins.clear();
  pins.resize(keys.size());
  // Carried into the chain's rest: it goes on until the first new block.
  DramStore::ChainPlace rest;
  rest.run = run;
  auto r = store->Reserve(Key(4), kValue);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(store->Commit(std::move(r).value(), &rest).ok());
  EXPECT_EQ(rest.run, 0);
  // A policy without shadows leaves the caller's run as it was.
  auto lru = Open("lru");
  PutChain(*lru, 0, 4);
  uint8_t untouched = 7;
  EXPECT_EQ(lru->AcquireBatch(keys, pins, &untouched), 4u);
  EXPECT_EQ(untouched, 7);
  pins.clear();  // before the stores go
}

// Which of keys [lo, hi) are present, as a string of 0/1.
std::string Present(DramStore& store, uint64_t lo, uint64_t hi) {
  std::string out;
  for (uint64_t k = lo; k < hi; ++k) out += store.Contains(Key(k)) ? '1' : '0';
  return out;
}

TEST(PrefixPolicyTest, NewKeysLeaveBeforeKeysThatWereHit) {
  auto store = Open("prefix");
  EXPECT_TRUE(store->touch_chains_head_last());
  for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 0; k < 100; ++k) Touch(*store, k);  // -> protected
  // 100 new keys: probation's cold end is 100..199.
  for (uint64_t k = 256; k < 356; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 0; k < 356; ++k) {
    ASSERT_EQ(store->Contains(Key(k)), k < 100 || k >= 200) << k;
  }
  EXPECT_EQ(store->GetStats().evictions, 100u);
}

TEST(PrefixPolicyTest, ProtectedOverflowGoesBackToProbationsWarmEnd) {
  auto store = Open("prefix");
  for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  // 200 hits: protected keeps the last 179 touched; 0..20 go back to
  // probation, behind 200..255.
  for (uint64_t k = 0; k < 200; ++k) Touch(*store, k);
  for (uint64_t k = 1000; k < 1060; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  // 60 evictions: 200..255 (56), then 0..3.
  EXPECT_EQ(Present(*store, 0, 8), "00001111");
  EXPECT_EQ(Present(*store, 196, 204), "11110000");
  EXPECT_EQ(Present(*store, 252, 256), "0000");
}

TEST(PrefixPolicyTest, AChainLeavesFromItsTail) {
  auto store = Open("prefix");
  PutChain(*store, 0, 10);  // one chain: 9 is the coldest, 0 the warmest
  for (uint64_t k = 100; k < 346; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  ASSERT_EQ(store->GetStats().entries, 256u);
  for (uint64_t k = 1000; k < 1003; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  EXPECT_EQ(Present(*store, 0, 10), "1111111000");
  EXPECT_EQ(Present(*store, 100, 346), std::string(246, '1'));
  // LRU (and S3-FIFO) keep the commit order: the chain's head goes first.
  auto lru = Open("lru");
  PutChain(*lru, 0, 10);
  for (uint64_t k = 100; k < 349; ++k) ASSERT_TRUE(Put(*lru, Key(k), kValue).ok());
  EXPECT_EQ(Present(*lru, 0, 10), "0001111111");
  EXPECT_FALSE(lru->touch_chains_head_last());
}

TEST(PrefixPolicyTest, AChainWhosePreviousEntryWentOnIsPlacedAsUsual) {
  auto store = Open("prefix");
  DramStore::ChainPlace chain;
  auto r = store->Reserve(Key(0), kValue);
  ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
  Touch(*store, 0);  // the anchor is now protected: the next goes to probation's warm end
  r = store->Reserve(Key(1), kValue);
  ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
  ASSERT_TRUE(store->Remove(Key(1)).ok());  // the anchor is gone
  r = store->Reserve(Key(2), kValue);
  ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
  // Entries 0 and 2, then 255 more: one eviction, probation's coldest: 2.
  for (uint64_t k = 100; k < 355; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  EXPECT_EQ(Present(*store, 0, 3), "100");
  EXPECT_EQ(store->GetStats().entries, 256u);
}

// A chain continued by another request (a value handed from another node
// names the key it follows): placed just colder than that key's entry, as
// if committed in the same batch; a key not held is placed as usual.
TEST(PrefixPolicyTest, AChainPlaceByKeyFollowsThatKeysEntry) {
  auto store = Open("prefix");
  PutChain(*store, 0, 5);  // 4 coldest ... 0 warmest
  for (uint64_t k = 5; k < 8; ++k) {
    DramStore::ChainPlace after = DramStore::ChainPlace::After(Key(k - 1));
    auto r = store->Reserve(Key(k), kValue);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(store->Commit(std::move(r).value(), &after).ok());
  }
  DramStore::ChainPlace nowhere = DramStore::ChainPlace::After(Key(5000));
  auto r = store->Reserve(Key(9), kValue);
  ASSERT_TRUE(store->Commit(std::move(r).value(), &nowhere).ok());  // probation's warm end
  for (uint64_t k = 100; k < 347; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  ASSERT_EQ(store->GetStats().entries, 256u);
  // Four more evict the chain's last four: 7, 6, 5, then 4.
  for (uint64_t k = 1000; k < 1004; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  EXPECT_EQ(Present(*store, 0, 8), "11110000");
  EXPECT_TRUE(store->Contains(Key(9)));
}

// A key the writer knows left the cache lately (another node's ghost, the
// pool's directory) is committed as a ghost hit: protected, so new keys go
// before it.
TEST(PrefixPolicyTest, AReturningKeyIsProtectedLikeAGhostHit) {
  auto store = Open("prefix");
  auto r = store->Reserve(Key(0), kValue);
  ASSERT_TRUE(store->Commit(std::move(r).value(), nullptr, /*returning=*/true).ok());
  r = store->Reserve(Key(1), kValue);
  ASSERT_TRUE(store->Commit(std::move(r).value(), nullptr, /*returning=*/false).ok());
  for (uint64_t k = 100; k < 355; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  // 257 committed, 256 slots: one eviction, probation's coldest: 1, not 0.
  EXPECT_EQ(Present(*store, 0, 2), "10");
}

// A chain coming back (ghost hits, or returning keys) is protected in its
// order too: its tail is the first of it to go.
TEST(PrefixPolicyTest, AReturningChainLeavesProtectedFromItsTail) {
  auto store = Open("prefix");
  DramStore::ChainPlace chain;
  for (uint64_t k = 0; k < 10; ++k) {
    auto r = store->Reserve(Key(k), kValue);
    ASSERT_TRUE(r.ok()) << k;
    ASSERT_TRUE(store->Commit(std::move(r).value(), &chain, /*returning=*/true).ok()) << k;
  }
  for (uint64_t k = 100; k < 346; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 100; k < 346; ++k) Touch(*store, k);  // all 256 protected
  // The next write enforces protected's share (179): its 77 least recently
  // used go back to probation, the chain first, and the coldest of them
  // leaves: the chain's tail, then the block before it.
  ASSERT_TRUE(Put(*store, Key(1000), kValue).ok());
  EXPECT_EQ(Present(*store, 0, 10), "1111111110");
  ASSERT_TRUE(Put(*store, Key(1001), kValue).ok());
  EXPECT_EQ(Present(*store, 0, 10), "1111111100");
  EXPECT_EQ(Present(*store, 100, 346), std::string(246, '1'));
}

TEST(PrefixPolicyTest, AReplicaIsFirstInLineToGo) {
  auto store = Open("prefix");
  for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  // A copy of another node's entry, read here: it takes 0's slot, and its
  // pin does not count as a hit.
  auto r = store->Reserve(Key(900), kValue);
  ASSERT_TRUE(r.ok());
  {
    auto pin = store->CommitAndAcquire(std::move(r).value(), /*replica=*/true);
    ASSERT_TRUE(pin.ok());
  }
  EXPECT_EQ(Present(*store, 0, 3), "011");
  // The next write evicts the replica, not 1.
  ASSERT_TRUE(Put(*store, Key(1000), kValue).ok());
  EXPECT_FALSE(store->Contains(Key(900)));
  EXPECT_EQ(Present(*store, 1, 3), "11");
  // A replica read again here is a hit like any other: it stays.
  r = store->Reserve(Key(901), kValue);
  ASSERT_TRUE(store->CommitAndAcquire(std::move(r).value(), /*replica=*/true).ok());
  Touch(*store, 901);
  ASSERT_TRUE(Put(*store, Key(1001), kValue).ok());
  EXPECT_TRUE(store->Contains(Key(901)));
  EXPECT_EQ(Present(*store, 1, 4), "001");
}

TEST(PrefixPolicyTest, AKeyEvictedRecentlyComesBackProtected) {
  auto store = Open("prefix");
  for (uint64_t k = 0; k < 300; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  ASSERT_FALSE(store->Contains(Key(0)));  // evicted from probation: remembered
  ASSERT_TRUE(Put(*store, Key(0), kValue).ok());     // -> protected
  ASSERT_TRUE(Put(*store, Key(5000), kValue).ok());  // never seen -> probation
  for (uint64_t k = 2000; k < 2300; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  EXPECT_TRUE(store->Contains(Key(0)));
  EXPECT_FALSE(store->Contains(Key(5000)));
}

// Protected ages under the prefix policy: once the traffic moves on to new
// keys only, every entry leaves, both one read once and one that came back
// from the ghost and was never read. Slowly: a scan of the cache's size
// passes through probation alone. "slru" (no ageing) keeps both for good.
TEST(PrefixPolicyTest, EveryEntryAgesOutOnceTheTrafficMovesOn) {
  for (const char* policy : {"prefix", "slru"}) {
    SCOPED_TRACE(policy);
    const bool ages = std::string(policy) == "prefix";
    auto store = Open(policy);
    for (uint64_t k = 0; k < 300; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    ASSERT_FALSE(store->Contains(Key(0)));
    ASSERT_TRUE(Put(*store, Key(0), kValue).ok());          // from the ghost: protected, never read
    for (uint64_t k = 100; k < 200; ++k) Touch(*store, k);  // read once: protected
    uint64_t next = 10000;
    for (int i = 0; i < 256; ++i) ASSERT_TRUE(Put(*store, Key(next++), kValue).ok());
    EXPECT_TRUE(store->Contains(Key(0)));
    EXPECT_EQ(Present(*store, 100, 200), std::string(100, '1'));
    // At one ageing step per 512 victims, 101 protected entries are gone
    // within 512 x 101 evictions (a bound, not the exact count).
    for (int i = 0; i < 512 * 101 + 256; ++i) {
      ASSERT_TRUE(Put(*store, Key(next++), kValue).ok());
    }
    EXPECT_EQ(store->Contains(Key(0)), !ages);
    EXPECT_EQ(Present(*store, 100, 200), std::string(100, ages ? '0' : '1'));
    EXPECT_EQ(Present(*store, 1, 100) + Present(*store, 200, 300), std::string(199, '0'));
    EXPECT_EQ(store->GetStats().entries, 256u);
  }
}

// The default policy's protected share follows the traffic (its shadow
// caches: shadow_shares.h). A conversation, whose blocks come back once
// after other conversations' turns, moves it to 0, where the store is an
// LRU and touches a batch's hits in order; a hot set read between one-off
// blocks moves it back up, and chains are touched head last again.
// prefix-fixed stays at 70 % throughout.
TEST(PrefixPolicyTest, TheProtectedShareFollowsTheTraffic) {
  auto store = Open("prefix");
  auto fixed = Open("prefix-fixed");
  EXPECT_FALSE(fixed->GetStats().eviction.adaptive);
  DramStats st = store->GetStats();
  ASSERT_TRUE(st.eviction.adaptive);
  EXPECT_EQ(st.eviction.protected_share, 0.7);
  EXPECT_EQ(st.eviction.sample_rate, 1.0);  // 256 entries: every key (kMinShadowEntries)
  EXPECT_TRUE(store->touch_chains_head_last());

  // A conversation: each step one new block, and the one written 100 steps
  // earlier read again once (199 other blocks used in between: an LRU of
  // 256 keeps it, probation's 77 at 70 % does not). A miss is written
  // again, as an engine writes a block it had to recompute: the shadows see
  // the store's hits and writes, not its misses.
  auto converse = [](DramStore& s, uint64_t from, uint64_t steps, uint64_t* hits) {
    for (uint64_t t = from; t < from + steps; ++t) {
      ASSERT_TRUE(Put(s, Key(t), kValue).ok());
      if (t < from + 100) continue;
      if (s.Acquire(Key(t - 100)).ok()) {
        ++*hits;
      } else {
        ASSERT_TRUE(Put(s, Key(t - 100), kValue).ok());
      }
    }
  };
  uint64_t hits = 0, fixed_hits = 0;
  converse(*store, 0, 40'000, &hits);
  converse(*fixed, 0, 40'000, &fixed_hits);
  st = store->GetStats();
  EXPECT_EQ(st.eviction.protected_share, 0.0);
  EXPECT_GE(st.eviction.share_changes, 1u);
  EXPECT_TRUE(store->touch_chains_head_last());  // at every share
  EXPECT_GT(st.eviction.shadow_hit_ratios[0], st.eviction.shadow_hit_ratios[3]);
  EXPECT_EQ(fixed->GetStats().eviction.protected_share, 0.0);  // not adaptive: no figures
  // Most of the 39,900 reads hit once the share moved; at 70 % almost none
  // do (a block back from the ghost that is read again).
  EXPECT_GT(hits, 30'000u);
  EXPECT_LT(fixed_hits, 1'000u);

  // A hot set of 150 read in turn, two one-off blocks per read (300 pass
  // between two reads of one hot block): only a protected list keeps it.
  for (uint64_t t = 0; t < 60'000; ++t) {
    const KeyId hot = Key(1'000'000 + t % 150);
    if (!store->Acquire(hot).ok()) {
      ASSERT_TRUE(Put(*store, hot, kValue).ok());
    }
    ASSERT_TRUE(Put(*store, Key(2'000'000 + 2 * t), kValue).ok());
    ASSERT_TRUE(Put(*store, Key(2'000'000 + 2 * t + 1), kValue).ok());
  }
  st = store->GetStats();
  EXPECT_GE(st.eviction.protected_share, 0.5);
  EXPECT_GE(st.eviction.share_changes, 2u);
  EXPECT_TRUE(store->touch_chains_head_last());
  EXPECT_EQ(Present(*store, 1'000'000, 1'000'150), std::string(150, '1'));
  EXPECT_EQ(st.entries, 256u);
}

// A loop of 384 keys read in turn (1.5 times the store's 256 slots), a
// miss written again: an LRU, and the prefix policy at any share that
// inserts at probation's warm end, let each key go before its turn, so
// nothing hits. The default policy's shadows move it to bimodal insertion
// (ShadowShares::kBimodal), which keeps most of what it holds from pass to
// pass. Then one-off keys only: every loop key still ages out.
TEST(PrefixPolicyTest, ALoopLargerThanTheStoreMovesItToBimodalInsertion) {
  auto loop = [](DramStore& s, uint64_t passes) {
    uint64_t hits = 0;
    for (uint64_t t = 0; t < passes * 384; ++t) {
      const KeyId k = Key(t % 384);
      if (s.Acquire(k).ok()) {
        ++hits;
      } else {
        EXPECT_TRUE(Put(s, k, kValue).ok()) << t;
      }
    }
    return hits;
  };
  auto store = Open("prefix");
  auto lru = Open("lru");
  auto fixed = Open("prefix-fixed");
  loop(*store, 40);
  DramStats st = store->GetStats();
  EXPECT_TRUE(st.eviction.bimodal);
  EXPECT_EQ(st.eviction.protected_share, 0.7);
  EXPECT_EQ(st.eviction.share_changes, 1u);
  EXPECT_TRUE(st.eviction.candidate_bimodal[4]);
  EXPECT_FALSE(st.eviction.candidate_bimodal[3]);
  EXPECT_GT(st.eviction.shadow_hit_ratios[4], 0.4);
  EXPECT_LT(st.eviction.shadow_hit_ratios[3], 0.01);
  // The next 10 passes (3,840 reads): about half hit (all 256 held keys
  // at most, 2,560); LRU and the fixed 70 % hit none.
  const uint64_t hits = loop(*store, 10);
  EXPECT_GT(hits, 1'500u);
  EXPECT_EQ(loop(*lru, 50), 0u);
  EXPECT_LT(loop(*fixed, 50), 10u);
  EXPECT_EQ(store->GetStats().entries, 256u);

  // One-off keys only: no shadow hits, so the choice stays; probation's
  // warm-end entries (one in 32 of them) push the loop's keys out, and
  // protected ages (one victim in 512), so none of them is kept forever.
  for (uint64_t t = 0; t < 200'000; ++t) ASSERT_TRUE(Put(*store, Key(1'000'000 + t), kValue).ok());
  st = store->GetStats();
  EXPECT_TRUE(st.eviction.bimodal);
  EXPECT_EQ(Present(*store, 0, 384), std::string(384, '0'));
  EXPECT_EQ(st.entries, 256u);
}

// A conversation of single blocks (as in TheProtectedShareFollowsTheTraffic)
// that moves the share to 0.
void MoveShareToZero(DramStore& store) {
  for (uint64_t t = 0; t < 40'000; ++t) {
    ASSERT_TRUE(Put(store, Key(t), kValue).ok());
    if (t >= 100 && !store.Acquire(Key(t - 100)).ok()) {
      ASSERT_TRUE(Put(store, Key(t - 100), kValue).ok());
    }
  }
  ASSERT_EQ(store.GetStats().eviction.protected_share, 0.0);
}

// At a share of 0 the prefix policy keeps exactly what an LRU keeps of
// single blocks: once a conversation moved the share there and 256 new
// keys replaced every entry, the same uniform random traffic over 1.5
// times the cache (misses written again, so keys come back from the
// ghost, which at any other share sends them to protected) hits and misses
// alike in both stores, and leaves the same keys.
TEST(PrefixPolicyTest, AtAShareOfZeroItIsAnLru) {
  auto store = Open("prefix");
  auto lru = Open("lru");
  MoveShareToZero(*store);
  const uint64_t changes = store->GetStats().eviction.share_changes;
  for (uint64_t k = 100'000; k < 100'256; ++k) {
    ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    ASSERT_TRUE(Put(*lru, Key(k), kValue).ok());
  }
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> dist(0, 383);
  uint64_t hits = 0, misses = 0;
  for (int i = 0; i < 50'000; ++i) {
    const KeyId key = Key(100'000 + dist(rng));
    const bool hit = store->Acquire(key).ok();
    ASSERT_EQ(lru->Acquire(key).ok(), hit)
        << i << " share " << store->GetStats().eviction.protected_share;
    if (hit) {
      ++hits;
      continue;
    }
    ++misses;
    ASSERT_TRUE(Put(*store, key, kValue).ok());
    ASSERT_TRUE(Put(*lru, key, kValue).ok());
  }
  // The traffic kept the share at 0, and had both hits and misses.
  EXPECT_EQ(store->GetStats().eviction.protected_share, 0.0);
  EXPECT_EQ(store->GetStats().eviction.share_changes, changes);
  EXPECT_GT(hits, 10'000u);
  EXPECT_GT(misses, 10'000u);
  EXPECT_EQ(Present(*store, 100'000, 100'384), Present(*lru, 100'000, 100'384));
}

// With chains, a share of 0 is an LRU of chains: LruPolicy's order over the
// same traffic with each batch taken from its last block to its first. An
// engine's request reads the first 1 to 4 blocks of a chain (the store
// touches its hits last to first) and writes the ones it missed as one
// chain in order (each placed just colder than the one before); the LRU is
// told the same hits last to first and writes the misses last to first.
// Both hit and miss alike, block for block, and keep the same keys; a
// chain leaves from its tail.
TEST(PrefixPolicyTest, AtAShareOfZeroChainsLeaveAnLruFromTheirTail) {
  auto store = Open("prefix");
  auto lru = Open("lru");
  MoveShareToZero(*store);
  const uint64_t changes = store->GetStats().eviction.share_changes;
  EXPECT_TRUE(store->touch_chains_head_last());
  constexpr uint64_t kLen = 4, kChains = 96;  // 384 blocks, 1.5 times the cache
  auto block = [](uint64_t c, uint64_t b) { return Key(200'000 + c * kLen + b); };
  for (uint64_t c = 0; c < 64; ++c) {
    for (uint64_t b = kLen; b-- > 0;) ASSERT_TRUE(Put(*lru, block(c, b), kValue).ok());
    DramStore::ChainPlace chain;
    for (uint64_t b = 0; b < kLen; ++b) {
      auto r = store->Reserve(block(c, b), kValue);
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
    }
  }
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<uint64_t> dist(0, kChains - 1);
  std::uniform_int_distribution<uint64_t> length(1, kLen);
  uint64_t hits = 0, misses = 0, partial = 0, turns = 0;
  for (int i = 0; i < 20'000; ++i) {
    // A conversation's turn between the reads, its block of 40 turns ago
    // read again (an LRU keeps it, probation at 70 % does not), so the
    // share stays at 0: the chain reads alone favour a protected list,
    // which keeps their often-read heads.
    const KeyId turn = Key(500'000 + i);
    ASSERT_TRUE(Put(*store, turn, kValue).ok());
    ASSERT_TRUE(Put(*lru, turn, kValue).ok());
    if (i >= 40) {
      const KeyId back = Key(500'000 + i - 40);
      const bool hit = store->Acquire(back).ok();
      ASSERT_EQ(lru->Acquire(back).ok(), hit) << i;
      turns += hit;
      if (!hit) {
        ASSERT_TRUE(Put(*store, back, kValue).ok());
        ASSERT_TRUE(Put(*lru, back, kValue).ok());
      }
    }
    // A chain's first 1 to 4 blocks, as prompts of one prefix differ in length.
    const uint64_t c = dist(rng), n = length(rng);
    std::vector<KeyId> keys;
    for (uint64_t b = 0; b < n; ++b) keys.push_back(block(c, b));
    std::string hit(n, '0');
    {
      std::vector<DramStore::Pin> pins(n);
      store->AcquireBatch(keys, pins);
      for (uint64_t b = 0; b < n; ++b) hit[b] = pins[b].valid() ? '1' : '0';
    }
    std::string lru_hit(n, '0');
    for (uint64_t b = n; b-- > 0;) lru_hit[b] = lru->Acquire(keys[b]).ok() ? '1' : '0';
    ASSERT_EQ(hit, lru_hit) << i;
    if (hit.find('0') != std::string::npos && hit.find('1') != std::string::npos) ++partial;
    DramStore::ChainPlace chain;
    for (uint64_t b = 0; b < n; ++b) {
      if (hit[b] == '1') {
        ++hits;
        continue;
      }
      ++misses;
      auto r = store->Reserve(keys[b], kValue);
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
    }
    for (uint64_t b = n; b-- > 0;) {
      if (hit[b] == '0') {
        ASSERT_TRUE(Put(*lru, keys[b], kValue).ok());
      }
    }
  }
  EXPECT_EQ(store->GetStats().eviction.protected_share, 0.0);
  EXPECT_EQ(store->GetStats().eviction.share_changes, changes);
  EXPECT_GT(hits, 10'000u) << misses << " " << partial;
  EXPECT_GT(misses, 10'000u) << hits;
  EXPECT_GT(partial, 1'000u);  // chains found in part
  EXPECT_GT(turns, 10'000u);
  EXPECT_EQ(Present(*store, 200'000, 200'000 + kChains * kLen),
            Present(*lru, 200'000, 200'000 + kChains * kLen));
  EXPECT_EQ(Present(*store, 500'000, 520'000), Present(*lru, 500'000, 520'000));

  // The oldest chain loses its tail first; an LRU that is told a chain in
  // order loses its head.
  PutChain(*store, 300'000, 300'004);
  PutChain(*lru, 300'000, 300'004);
  for (uint64_t k = 400'000; k < 400'253; ++k) {
    ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    ASSERT_TRUE(Put(*lru, Key(k), kValue).ok());
  }
  EXPECT_EQ(Present(*store, 300'000, 300'004), "1110");
  EXPECT_EQ(Present(*lru, 300'000, 300'004), "0111");
}

// W-TinyLFU: a new key passes a window of 1 % (2 of 256 slots) and enters
// main only when the sketch has seen it more often than main's least
// recent entry; on a tie the newcomer goes.
TEST(TinyLfuTest, ANewKeyEntersMainOnlyWhenSeenMoreOftenThanItsVictim) {
  auto store = Open("tinylfu");
  EXPECT_FALSE(store->touch_chains_head_last());
  // While the store fills, the window's overflow enters main as it comes.
  for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 0; k < 10; ++k) Touch(*store, k);  // 0..9 seen twice
  // 1,000 one-off keys: each ties with main's victim (seen once) and goes.
  for (uint64_t k = 1000; k < 2000; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  EXPECT_EQ(Present(*store, 0, 254), std::string(254, '1'));
  // 254 and 255 were the window; the last two one-offs are now.
  EXPECT_EQ(Present(*store, 254, 256), "00");
  EXPECT_EQ(Present(*store, 1000, 1998), std::string(998, '0'));
  EXPECT_EQ(Present(*store, 1998, 2000), "11");
  // A key written again after its miss (seen twice) beats main's victim
  // (10, seen once) once the next newcomer pushes it out of the window.
  ASSERT_TRUE(Put(*store, Key(1000), kValue).ok());
  ASSERT_TRUE(Put(*store, Key(3000), kValue).ok());
  ASSERT_TRUE(Put(*store, Key(3001), kValue).ok());
  EXPECT_TRUE(store->Contains(Key(1000)));
  EXPECT_FALSE(store->Contains(Key(10)));
  EXPECT_TRUE(store->Contains(Key(11)));
  EXPECT_EQ(store->GetStats().entries, 256u);
}

// A hot set survives a one-time scan four times the cache under the prefix
// policy and S3-FIFO, and is flushed by it under LRU. The prefix policy's
// ageing costs it one entry: of the scan's 768 evictions, the 512th sent
// protected's oldest entry back to probation, and the scan flushed it.
TEST(EvictionTest, ScanResistance) {
  for (const char* policy : {"prefix", "s3fifo", "lru", "slru", "tinylfu"}) {
    auto store = Open(policy);
    for (uint64_t k = 0; k < 100; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    for (int round = 0; round < 3; ++round) {
      for (uint64_t k = 0; k < 100; ++k) Touch(*store, k);
    }
    for (uint64_t k = 10000; k < 11024; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    uint64_t hot = 0;
    for (uint64_t k = 0; k < 100; ++k) hot += store->Contains(Key(k));
    const std::string p = policy;
    EXPECT_EQ(hot, p == "lru" ? 0u : p == "prefix" ? 99u : 100u) << policy;
    EXPECT_EQ(store->GetStats().entries, 256u) << policy;
  }
}

TEST(EvictionTest, LruEvictsLeastRecentlyUsed) {
  auto store = Open("lru");
  for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  Touch(*store, 0);
  Touch(*store, 5);
  for (uint64_t k = 256; k < 266; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
  for (uint64_t k = 0; k < 266; ++k) {
    const bool expect = k == 0 || k == 5 || k >= 12;
    ASSERT_EQ(store->Contains(Key(k)), expect) << k;
  }
}

// Fill the store, pin some entries of several sizes, churn heavily with all
// sizes (slab moves, runs): the pinned entries keep their bytes and stay
// acquirable at the same offsets.
TEST(EvictionTest, PinnedEntriesSurviveHeavyChurn) {
  for (const char* policy : {"prefix", "s3fifo", "lru"}) {
    DramOptions o = SmallOptions(32 * MiB, 1 * MiB);
    o.eviction = policy;
    auto store = std::move(DramStore::Open(o, nullptr)).value();
    const uint64_t sizes[] = {4 * KiB, 64 * KiB, 300 * KiB, 1 * MiB, 3 * MiB};
    struct Held {
      uint64_t key, size;
      DramStore::Pin pin;
    };
    std::vector<Held> held;
    uint64_t k = 0;
    for (uint64_t size : sizes) {
      for (int i = 0; i < 3; ++i, ++k) {
        ASSERT_TRUE(Put(*store, Key(k), size).ok());
        auto pin = store->Acquire(Key(k));
        ASSERT_TRUE(pin.ok());
        held.push_back(Held{k, size, std::move(pin).value()});
      }
    }
    uint64_t pinned_bytes = 0;
    for (const Held& h : held) pinned_bytes += h.size;
    std::mt19937_64 rng(1);
    for (int i = 0; i < 3000; ++i, ++k) {
      const uint64_t size = sizes[rng() % std::size(sizes)];
      Status st = Put(*store, Key(k), size);
      ASSERT_TRUE(st.ok()) << st.ToString();
      if (i % 3 == 0) (void)store->Acquire(Key(k - rng() % 50));
    }
    const DramStats s = store->GetStats();
    EXPECT_GT(s.evictions, 2000u);
    EXPECT_GT(s.slab_moves, 0u);
    EXPECT_EQ(s.pinned, held.size());
    for (const Held& h : held) {
      ASSERT_TRUE(CheckPattern(Key(h.key), store->segment_base() + h.pin.offset(), h.size));
      auto again = store->Acquire(Key(h.key));
      ASSERT_TRUE(again.ok()) << policy << " " << h.key;
      EXPECT_EQ(again->offset(), h.pin.offset());
    }
    uint64_t still = 0;
    for (const Held& h : held) still += store->Contains(Key(h.key)) ? h.size : 0;
    EXPECT_EQ(still, pinned_bytes);
    held.clear();
    EXPECT_EQ(store->GetStats().pinned, 0u);
  }
}

}  // namespace
}  // namespace kvpool::dram
