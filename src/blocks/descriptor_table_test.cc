// The descriptor table over a scripted holdings stream: which descriptor
// each event carries, the per-hash tier counts and their transitions, and
// the bounds.
#include "blocks/descriptor_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "blocks/flat_map.h"
#include "testing/wait_for.h"

namespace kvpool::blocks {
namespace {

KeyId K(int i) { return MakeKeyId("blocks", std::to_string(i)); }

std::string Desc(uint64_t hash, uint32_t block_size = 4) {
  protocol::BlockDescriptor d;
  d.hash = {protocol::EngineHash::Kind::kUint64, hash, ""};
  d.block_size = block_size;
  auto b = protocol::EncodeDescriptor(d);
  EXPECT_TRUE(b.ok());
  return *b;
}

Descriptor S(const std::string& s) { return Descriptor::Parse(s); }

HoldingsEvent Written(const KeyId& k) {
  HoldingsEvent e;
  e.key = k;
  return e;
}

HoldingsEvent Dropped(const KeyId& k, HoldingTier tier, HoldingsEvent::Why why, bool still_held) {
  HoldingsEvent e;
  e.kind = HoldingsEvent::Kind::kDropped;
  e.key = k;
  e.tier = tier;
  e.why = why;
  e.still_held = still_held;
  return e;
}

struct Recorder : BlockEventListener, BlockTierListener {
  std::vector<std::pair<KeyId, std::string>> events;  // key, descriptor ("" none)
  std::vector<std::tuple<uint64_t, BlockTier, bool>> tiers;
  void OnBlockEvent(const HoldingsEvent& e, const Descriptor& d) override {
    events.emplace_back(e.key, std::string(d.str()));
  }
  void OnBlockTier(uint64_t h, BlockTier t, bool held) override { tiers.emplace_back(h, t, held); }
};

TEST(DescriptorTable, TwoKeysOfOneBlockHoldItUntilTheLastLeaves) {
  MetricsRegistry metrics;
  DescriptorTable table(1 << 20, &metrics);
  Recorder rec;
  table.SetListeners(&rec, &rec);
  const std::string d = Desc(0x77);
  // Two ranks' keys of one engine block, and an undescribed key.
  ASSERT_NE(table.Stage(K(1), S(d)), 0u);
  ASSERT_NE(table.Stage(K(2), S(d)), 0u);
  table.OnHoldings(Written(K(1)));
  table.OnHoldings(Written(K(2)));
  table.OnHoldings(Written(K(3)));
  uint8_t tiers[2];
  const uint64_t hashes[2] = {0x77, 0x78};
  table.Tiers(hashes, tiers);
  EXPECT_EQ(tiers[0], 1);
  EXPECT_EQ(tiers[1], 0);
  // K(1) demoted: the block is on both tiers (K(2) stays in DRAM); K(2)
  // evicted: DRAM's last key of it is gone.
  table.OnHoldings(Dropped(K(1), HoldingTier::kDram, HoldingsEvent::Why::kMovedToSsd, true));
  table.Tiers(hashes, tiers);
  EXPECT_EQ(tiers[0], 3);
  table.OnHoldings(Dropped(K(2), HoldingTier::kDram, HoldingsEvent::Why::kEvicted, false));
  table.Tiers(hashes, tiers);
  EXPECT_EQ(tiers[0], 2);
  std::vector<std::pair<uint64_t, BlockTier>> held;
  table.ForEachHeld([&](uint64_t h, BlockTier t) { held.emplace_back(h, t); });
  EXPECT_EQ(held, (std::vector<std::pair<uint64_t, BlockTier>>{{0x77, BlockTier::kSsd}}));
  table.OnHoldings(Dropped(K(1), HoldingTier::kSsd, HoldingsEvent::Why::kRemoved, false));
  table.Tiers(hashes, tiers);
  EXPECT_EQ(tiers[0], 0);
  EXPECT_EQ(table.entries(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
  EXPECT_EQ(metrics.ValueOf("kvpool_descriptors"), 0);

  table.Sync();
  const std::vector<std::tuple<uint64_t, BlockTier, bool>> want = {{0x77, BlockTier::kDram, true},
                                                                   {0x77, BlockTier::kSsd, true},
                                                                   {0x77, BlockTier::kDram, false},
                                                                   {0x77, BlockTier::kSsd, false}};
  EXPECT_EQ(rec.tiers, want);
  ASSERT_EQ(rec.events.size(), 6u);
  EXPECT_EQ(rec.events[0].second, d);
  EXPECT_EQ(rec.events[1].second, d);
  EXPECT_EQ(rec.events[2].second, "");  // K(3): undescribed
  EXPECT_EQ(rec.events[5].second, d);   // its last event still carries it
  table.SetListeners(nullptr, nullptr);
}

// Without a tier listener the per-hash counts start with the first read
// that needs them: that read, the reads after it, and a tier listener set
// later see exactly what a table counting from its start would.
TEST(DescriptorTable, CountsStartedByAReadMatchCountsKeptThroughout) {
  MetricsRegistry metrics;
  DescriptorTable lazy(1 << 20, &metrics);
  MetricsRegistry metrics2;
  DescriptorTable eager(1 << 20, &metrics2);
  Recorder eager_rec;
  eager.SetListeners(nullptr, &eager_rec);
  const uint64_t hashes[4] = {0x10, 0x11, 0x12, 0x13};
  auto both = [&](auto&& fn) {
    fn(lazy);
    fn(eager);
  };
  // 0x10: two keys, one demoted to SSD; 0x11: one key, evicted; 0x12: in
  // SSD only; 0x13: never stored (its stage only).
  both([&](DescriptorTable& t) {
    for (int i = 0; i < 4; ++i) ASSERT_NE(t.Stage(K(i), S(Desc(0x10 + (i == 0 ? 0 : i - 1)))), 0u);
    ASSERT_NE(t.Stage(K(9), S(Desc(0x13))), 0u);
    for (int i = 0; i < 4; ++i) t.OnHoldings(Written(K(i)));
    t.OnHoldings(Dropped(K(1), HoldingTier::kDram, HoldingsEvent::Why::kMovedToSsd, true));
    t.OnHoldings(Dropped(K(2), HoldingTier::kDram, HoldingsEvent::Why::kEvicted, false));
    t.OnHoldings(Dropped(K(3), HoldingTier::kDram, HoldingsEvent::Why::kMovedToSsd, true));
  });
  uint8_t got[4], want[4];
  lazy.Tiers(hashes, got);
  eager.Tiers(hashes, want);
  EXPECT_EQ(std::vector<uint8_t>(got, got + 4), (std::vector<uint8_t>{3, 0, 2, 0}));
  EXPECT_EQ(std::vector<uint8_t>(want, want + 4), (std::vector<uint8_t>{3, 0, 2, 0}));
  // A tier listener set now is told each hash's last key leaving, as the
  // eager table's listener is.
  Recorder lazy_rec;
  lazy.SetListeners(nullptr, &lazy_rec);
  eager_rec.tiers.clear();
  both([&](DescriptorTable& t) {
    t.OnHoldings(Dropped(K(0), HoldingTier::kDram, HoldingsEvent::Why::kEvicted, false));
    t.OnHoldings(Dropped(K(1), HoldingTier::kDram, HoldingsEvent::Why::kEvicted, true));
    t.OnHoldings(Dropped(K(1), HoldingTier::kSsd, HoldingsEvent::Why::kRemoved, false));
    t.Sync();
  });
  const std::vector<std::tuple<uint64_t, BlockTier, bool>> told = {{0x10, BlockTier::kDram, false},
                                                                   {0x10, BlockTier::kSsd, false}};
  EXPECT_EQ(lazy_rec.tiers, told);
  EXPECT_EQ(eager_rec.tiers, told);
  std::vector<std::pair<uint64_t, BlockTier>> held;
  lazy.ForEachHeld([&](uint64_t h, BlockTier t) { held.emplace_back(h, t); });
  EXPECT_EQ(held, (std::vector<std::pair<uint64_t, BlockTier>>{{0x12, BlockTier::kSsd}}));
  lazy.SetListeners(nullptr, nullptr);
  eager.SetListeners(nullptr, nullptr);
}

// A put's commit that failed leaves nothing; a key re-put after it left
// takes the new descriptor; a key told evicted before its write is named by
// its staged descriptor, which it drops.
TEST(DescriptorTable, StagesFollowTheirCommits) {
  MetricsRegistry metrics;
  DescriptorTable table(1 << 20, &metrics);
  Recorder rec;
  table.SetListeners(&rec, &rec);
  const std::string a = Desc(1), b = Desc(2);
  const uint64_t t = table.Stage(K(1), S(a));
  table.Unstage(K(1), t);
  EXPECT_EQ(table.entries(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
  table.Unstage(K(1), 12345);  // unknown: ignored

  table.Stage(K(1), S(a));
  table.OnHoldings(Written(K(1)));
  table.OnHoldings(Dropped(K(1), HoldingTier::kDram, HoldingsEvent::Why::kEvicted, false));
  table.Stage(K(1), S(b));
  table.OnHoldings(Written(K(1)));
  table.Sync();
  ASSERT_EQ(rec.events.size(), 3u);
  EXPECT_EQ(rec.events[2].second, b);

  // Evicted before its write was told.
  table.Stage(K(5), S(a));
  table.OnHoldings(Dropped(K(5), HoldingTier::kDram, HoldingsEvent::Why::kEvicted, false));
  table.Sync();
  EXPECT_EQ(rec.events.back().second, a);
  table.OnHoldings(Written(K(5)));
  table.Sync();
  EXPECT_EQ(rec.events.back().second, "");
  EXPECT_EQ(table.entries(), 1u);  // K(1)

  // A stage that does not decode is not kept.
  EXPECT_EQ(table.Stage(K(9), S(std::string("junk"))), 0u);
  table.SetListeners(nullptr, nullptr);
}

TEST(DescriptorTable, AFullTableRefusesCounted) {
  MetricsRegistry metrics;
  const std::string d = Desc(3);
  DescriptorTable table(2 * (d.size() + DescriptorTable::kEntryOverheadBytes), &metrics);
  EXPECT_NE(table.Stage(K(1), S(d)), 0u);
  const uint64_t t2 = table.Stage(K(2), S(d));
  ASSERT_NE(t2, 0u);
  EXPECT_EQ(table.Stage(K(3), S(d)), 0u);
  // A stage counts until it goes: a second stage of K(2) does not fit
  // beside its first; once that is undone (its commit failed) and the undo
  // applied, K(3) does.
  EXPECT_EQ(table.Stage(K(2), S(d)), 0u);
  table.Unstage(K(2), t2);
  table.Sync();
  EXPECT_NE(table.Stage(K(3), S(d)), 0u);
  EXPECT_EQ(metrics.ValueOf("kvpool_descriptors_refused_total"), 2);
  EXPECT_EQ(table.bytes(), 2 * (d.size() + DescriptorTable::kEntryOverheadBytes));
  EXPECT_EQ(table.entries(), 2u);
}

// The write path only queues: the table's thread applies a change within
// its interval, with no read to ask for it; while nothing is described or
// queued, an event passes on at once.
TEST(DescriptorTable, ChangesAreAppliedOffTheWritePath) {
  MetricsRegistry metrics;
  DescriptorTable table(1 << 20, &metrics, std::chrono::milliseconds(1));
  Recorder rec;
  table.SetListeners(&rec, &rec);
  table.OnHoldings(Written(K(7)));  // undescribed, nothing queued: at once
  ASSERT_EQ(rec.events.size(), 1u);
  EXPECT_EQ(rec.events[0].second, "");
  const std::string d = Desc(0x99);
  ASSERT_NE(table.Stage(K(1), S(d)), 0u);
  table.OnHoldings(Written(K(1)));
  table.OnHoldings(Written(K(8)));  // queued behind K(1)'s, in order
  // kvpool_descriptors is set by an apply only.
  testing::WaitFor([&] { return metrics.ValueOf("kvpool_descriptors") == 1; },
                   std::chrono::seconds(2), std::chrono::milliseconds(1));
  EXPECT_EQ(metrics.ValueOf("kvpool_descriptors"), 1);
  table.Sync();  // orders the applier's writes before the reads below
  ASSERT_EQ(rec.events.size(), 3u);
  EXPECT_EQ(rec.events[1].first, K(1));
  EXPECT_EQ(rec.events[1].second, d);
  EXPECT_EQ(rec.events[2].first, K(8));
  EXPECT_EQ(rec.tiers.size(), 1u);
  table.SetListeners(nullptr, nullptr);
}

// More changes than the queue holds, with no applier interval to drain
// them: the writer that fills the queue applies it, so none is lost.
TEST(DescriptorTable, AFullQueueIsAppliedByItsWriter) {
  MetricsRegistry metrics;
  DescriptorTable table(64u << 20, &metrics, std::chrono::hours(1));
  Recorder rec;
  table.SetListeners(&rec, nullptr);
  const std::string d = Desc(5);
  // Two changes a key: the queue fills at key n/2 - 1, the last key's wait.
  const int n = static_cast<int>(DescriptorTable::kMaxQueued) / 2 + 1;
  for (int i = 0; i < n; ++i) {
    ASSERT_NE(table.Stage(K(i), S(d)), 0u);
    table.OnHoldings(Written(K(i)));
  }
  EXPECT_EQ(metrics.ValueOf("kvpool_descriptors"), n - 1);  // applied by the writer
  EXPECT_EQ(table.entries(), static_cast<uint64_t>(n));
  EXPECT_EQ(rec.events.size(), static_cast<size_t>(n));
  table.SetListeners(nullptr, nullptr);
}

TEST(DescriptorTable, EngineHash64ReadsBytesAsTheirLastEightBigEndian) {
  protocol::EngineHash h{protocol::EngineHash::Kind::kBytes, 0,
                         std::string("\xff\x01\x02\x03\x04\x05\x06\x07\x08", 9)};
  EXPECT_EQ(EngineHash64(h), 0x0102030405060708u);
  h.bytes = std::string("\x01\x02", 2);
  EXPECT_EQ(EngineHash64(h), 0x0102u);
  EXPECT_EQ(EngineHash64(protocol::EngineHash{protocol::EngineHash::Kind::kInt64, ~0ull, ""}), ~0ull);
}

}  // namespace
}  // namespace kvpool::blocks

namespace kvpool::blocks {
namespace {

// The flat map against std::map under random inserts and erases that
// collide on purpose (a hash of a few buckets): every lookup agrees.
TEST(FlatMap, AgreesWithAStdMapUnderRandomInsertsAndErases) {
  struct FewBuckets {
    size_t operator()(uint64_t k) const { return static_cast<size_t>(k % 7); }
  };
  FlatMap<uint64_t, uint64_t, FewBuckets> flat(16);
  FlatMap<uint64_t, uint64_t, std::hash<uint64_t>> spread(16);
  std::map<uint64_t, uint64_t> want;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t k = rng() % 500;
    if (rng() % 3 == 0) {
      flat.Erase(k);
      spread.Erase(k);
      want.erase(k);
    } else {
      *flat.Emplace(k).first = k * 3 + static_cast<uint64_t>(i);
      *spread.Emplace(k).first = k * 3 + static_cast<uint64_t>(i);
      want[k] = k * 3 + static_cast<uint64_t>(i);
    }
    if (i % 97 == 0) {
      for (uint64_t q = 0; q < 500; ++q) {
        auto it = want.find(q);
        const uint64_t* a = flat.Find(q);
        const uint64_t* b = spread.Find(q);
        ASSERT_EQ(a != nullptr, it != want.end()) << q;
        ASSERT_EQ(b != nullptr, it != want.end()) << q;
        if (a != nullptr) {
          ASSERT_EQ(*a, it->second);
          ASSERT_EQ(*b, it->second);
        }
      }
      ASSERT_EQ(flat.size(), want.size());
    }
  }
  size_t n = 0;
  flat.ForEach([&](uint64_t k, uint64_t v) {
    EXPECT_EQ(want.at(k), v);
    ++n;
  });
  EXPECT_EQ(n, want.size());
}

}  // namespace
}  // namespace kvpool::blocks
