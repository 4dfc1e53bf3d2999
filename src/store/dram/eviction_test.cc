// Eviction order of S3-FIFO and LRU, scan resistance, and pins under churn.
#include <gtest/gtest.h>

#include <random>

#include "store/dram/dram_store.h"
#include "store/dram/dram_test_util.h"

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

// A hot set survives a one-time scan four times the cache under S3-FIFO, and
// is flushed by it under LRU.
TEST(EvictionTest, ScanResistance) {
  for (const char* policy : {"s3fifo", "lru"}) {
    auto store = Open(policy);
    for (uint64_t k = 0; k < 100; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    for (int round = 0; round < 3; ++round) {
      for (uint64_t k = 0; k < 100; ++k) Touch(*store, k);
    }
    for (uint64_t k = 10000; k < 11024; ++k) ASSERT_TRUE(Put(*store, Key(k), kValue).ok());
    uint64_t hot = 0;
    for (uint64_t k = 0; k < 100; ++k) hot += store->Contains(Key(k));
    if (std::string(policy) == "s3fifo") {
      EXPECT_EQ(hot, 100u);
    } else {
      EXPECT_EQ(hot, 0u);
    }
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
  for (const char* policy : {"s3fifo", "lru"}) {
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
