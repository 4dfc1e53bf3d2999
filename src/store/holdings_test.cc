// The holdings stream (store/holdings.h): a scripted sequence of puts,
// evictions, demotions, promotions, removes and SSD reclaims produces exactly
// the events it must, for a DRAM-only store and a DRAM+SSD store.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "common/executor.h"
#include "store/holdings.h"
#include "store/ssd/memory_device.h"
#include "store/ssd/ssd_store.h"
#include "store/tiered_store.h"

namespace kvpool {
namespace {

constexpr uint64_t kMiB = 1 << 20;
using Why = HoldingsEvent::Why;
using Kind = HoldingsEvent::Kind;

KeyId K(int i) { return MakeKeyId("holdings", std::to_string(i)); }

// Records every event; counts them by (kind, why, tier, still_held) and
// keeps, per key, how often it entered and left the node.
class Recorder final : public HoldingsObserver {
 public:
  void OnHoldings(const HoldingsEvent& e) override {
    std::lock_guard lock(mu_);
    ++counts_[{e.kind, e.why, e.tier, e.still_held}];
    if (e.enters_node()) ++net_[e.key];
    if (e.leaves_node()) --net_[e.key];
    origins_.push_back(e.origin);
    sizes_ok_ = sizes_ok_ && e.size == expected_size_;
  }
  uint64_t Count(Kind k, Why w, HoldingTier t, bool still_held = false) {
    std::lock_guard lock(mu_);
    auto it = counts_.find({k, w, t, still_held});
    return it == counts_.end() ? 0 : it->second;
  }
  uint64_t Total() {
    std::lock_guard lock(mu_);
    uint64_t n = 0;
    for (const auto& [k, v] : counts_) n += v;
    return n;
  }
  // Entered minus left: 1 for a key held now, 0 for one that is not.
  int Net(const KeyId& key) {
    std::lock_guard lock(mu_);
    return net_[key];
  }
  bool SizesOk() {
    std::lock_guard lock(mu_);
    return sizes_ok_;
  }
  void ExpectSize(uint64_t n) { expected_size_ = n; }

 private:
  std::mutex mu_;
  std::map<std::tuple<Kind, Why, HoldingTier, bool>, uint64_t> counts_;
  std::map<KeyId, int> net_;
  std::vector<WriteOrigin> origins_;
  uint64_t expected_size_ = kMiB;
  bool sizes_ok_ = true;
};

DramOptions SixteenMiB() {
  DramOptions d;
  d.capacity_bytes = 16 * kMiB;
  d.slab_bytes = kMiB;
  d.max_value_bytes = kMiB;
  d.huge_pages = false;
  d.prefault = false;
  return d;
}

Status Put(TieredStore* s, int i, WriteOrigin origin = WriteOrigin::kPut) {
  auto r = s->Reserve(K(i), kMiB);
  if (!r.ok()) return r.status();
  std::memset(r->data(), i, kMiB);
  return s->Commit(std::move(r).value(), origin);
}

Status Promote(TieredStore* s, int i) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status result;
  s->AcquireOrPromote(K(i), [&](Status st, TieredStore::Pin pin) {
    std::lock_guard lock(mu);
    result = st;
    if (st.ok() && (pin.size() != kMiB || pin.data()[kMiB - 1] != static_cast<uint8_t>(i))) {
      result = Corruption("wrong bytes");
    }
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  return result;
}

// Observes the store, then puts keys 0..23 through its 16 MiB of DRAM.
void PutTwentyFour(TieredStore* s, Recorder* rec) {
  s->SetHoldingsObserver(rec);
  for (int i = 0; i < 24; ++i) ASSERT_TRUE(Put(s, i).ok()) << i;
  ASSERT_EQ(s->GetDramStats().evictions, 8u);
  EXPECT_EQ(rec->Count(Kind::kStored, Why::kWritten, HoldingTier::kDram), 24u);
}

TEST(HoldingsStreamTest, DramOnly) {
  MetricsRegistry metrics;
  ThreadPool pool(1, "test-promote");
  auto store = TieredStore::Open(SixteenMiB(), nullptr, &pool, &pool, TieringOptions{}, &metrics);
  ASSERT_TRUE(store.ok());
  TieredStore* s = store->get();
  Recorder rec;
  // 24 values of 1 MiB through 16 one-value slabs: 8 evictions.
  PutTwentyFour(s, &rec);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kEvicted, HoldingTier::kDram), 8u);

  // A second writer of a held key is refused: no event.
  EXPECT_EQ(Put(s, 23).code(), StatusCode::kAlreadyExists);
  // A copy from a peer, removes (one of a missing key), a hand-off.
  ASSERT_TRUE(Put(s, 100, WriteOrigin::kCopy).ok());  // evicts one more
  ASSERT_TRUE(s->Remove(K(23)).ok());
  ASSERT_TRUE(s->Remove(K(22)).ok());
  EXPECT_EQ(s->Remove(K(22)).code(), StatusCode::kNotFound);
  ASSERT_TRUE(s->Remove(K(21), Why::kHandedOff).ok());

  EXPECT_EQ(rec.Count(Kind::kStored, Why::kWritten, HoldingTier::kDram), 25u);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kEvicted, HoldingTier::kDram), 9u);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kRemoved, HoldingTier::kDram), 2u);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kHandedOff, HoldingTier::kDram), 1u);
  EXPECT_EQ(rec.Total(), 25u + 9 + 2 + 1);
  EXPECT_TRUE(rec.SizesOk());
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                23, 100}) {
    EXPECT_EQ(rec.Net(K(i)), s->Contains(K(i)) ? 1 : 0) << i;
  }

  // No observer: nothing is told (and the store works on).
  s->SetHoldingsObserver(nullptr);
  ASSERT_TRUE(Put(s, 200).ok());
  EXPECT_EQ(rec.Total(), 37u);
}

TEST(HoldingsStreamTest, DramAndSsd) {
  MetricsRegistry metrics;
  ThreadPool promote_pool(1, "test-promote");
  ThreadPool flush_pool(2, "test-flush");
  MemoryDisk disk;
  SsdOptions so;
  so.dirs = {"/mem/a"};
  so.capacity_bytes = 24 * kMiB;  // 6 regions of 4 MiB, 3 values each
  so.region_bytes = 4 * kMiB;
  so.device_factory = disk.Factory();
  auto store =
      TieredStore::Open(SixteenMiB(), &so, &promote_pool, &flush_pool, TieringOptions{}, &metrics);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  TieredStore* s = store->get();
  Recorder rec;
  // 24 puts: 8 evictions, each demoted (still held, on SSD).
  PutTwentyFour(s, &rec);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kMovedToSsd, HoldingTier::kDram, true), 8u);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kEvicted, HoldingTier::kDram), 0u);

  // Promoting key 0 (SSD only) stores it in DRAM again and demotes one more.
  ASSERT_TRUE(s->Where(K(0)) == HoldingTier::kSsd);
  ASSERT_TRUE(Promote(s, 0).ok());
  EXPECT_EQ(rec.Count(Kind::kStored, Why::kPromoted, HoldingTier::kDram), 1u);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kMovedToSsd, HoldingTier::kDram, true), 9u);

  // Removing key 0 (in both tiers): one event per tier, the last leaving the
  // node. Removing key 1 (SSD only): one event.
  ASSERT_TRUE(s->Remove(K(0)).ok());
  ASSERT_TRUE(s->Where(K(1)) == HoldingTier::kSsd);
  ASSERT_TRUE(s->Remove(K(1)).ok());
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kRemoved, HoldingTier::kDram, true), 1u);
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kRemoved, HoldingTier::kSsd, false), 2u);

  // 30 more puts (the first into the slot key 0 left): 29 demotions through
  // a 6-region SSD tier, whose oldest regions are reclaimed; each entry
  // reclaimed and not in DRAM leaves.
  for (int i = 24; i < 54; ++i) ASSERT_TRUE(Put(s, i).ok()) << i;
  ASSERT_TRUE(s->Flush().ok());
  const uint64_t demoted = metrics.ValueOf("kvpool_tier_demotions_total");
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kMovedToSsd, HoldingTier::kDram, true), 38u);
  EXPECT_EQ(demoted, 38u);  // every eviction was written back
  const uint64_t reclaimed = rec.Count(Kind::kDropped, Why::kEvicted, HoldingTier::kSsd, false);
  EXPECT_GT(reclaimed, 0u);
  EXPECT_EQ(reclaimed, static_cast<uint64_t>(metrics.ValueOf("kvpool_ssd_drops_reported_total")));
  EXPECT_EQ(rec.Count(Kind::kDropped, Why::kEvicted, HoldingTier::kSsd, true), 0u);

  // Exactly: every key entered once, and left once unless held now.
  int held = 0;
  for (int i = 0; i < 54; ++i) {
    EXPECT_EQ(rec.Net(K(i)), s->Contains(K(i)) ? 1 : 0) << i;
    held += s->Contains(K(i)) ? 1 : 0;
  }
  EXPECT_EQ(static_cast<uint64_t>(held), 54 - 2 - reclaimed);
  EXPECT_EQ(rec.Total(), 54u + 1 + 38 + 3 + reclaimed);
  EXPECT_TRUE(rec.SizesOk());
  promote_pool.Stop();
  s->SetHoldingsObserver(nullptr);
  ASSERT_TRUE(s->Close().ok());
  flush_pool.Stop();
}

}  // namespace
}  // namespace kvpool
