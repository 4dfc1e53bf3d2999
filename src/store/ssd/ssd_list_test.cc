// SsdStore::ListEntries: the live entries with their full key ids and sizes,
// from buffers and from disk, after restarts; outdated copies, removed and
// reclaimed entries never listed; the filter and the early stop. The drop
// listener: exactly the live entries of reclaimed and lost regions.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "store/ssd/ssd_test_util.h"

namespace kvpool::ssd::testing {
namespace {

using SsdListTest = SsdFixture;

using Listing = std::map<KeyId, uint64_t>;

SsdKeyFilter All() {
  return [](uint64_t) { return true; };
}

// Lists with `want`; a key listed twice fails the test.
Listing List(SsdStore& s, const SsdKeyFilter& want, uint64_t* returned = nullptr) {
  Listing out;
  uint64_t n = s.ListEntries(want, [&](const std::vector<SsdEntry>& batch) {
    EXPECT_FALSE(batch.empty());
    for (const SsdEntry& e : batch) EXPECT_TRUE(out.emplace(e.key, e.size).second) << e.key.ToHex();
    return true;
  });
  EXPECT_EQ(n, out.size());
  if (returned != nullptr) *returned = n;
  return out;
}

size_t SizeOf(int i) { return 1 + (static_cast<size_t>(i) * 7919) % (150 << 10); }

bool Insert(SsdStore& s, int i, size_t n) {
  auto v = Value(i, n);
  return s.Insert(Key(i), v.data(), n);
}

TEST_F(SsdListTest, ListsExactKeysAndSizesFromDiskAndBuffers) {
  auto s = Open(Options(2, 2 * (kSuperblockBytes + (16 << 20))));
  ASSERT_NE(s, nullptr);
  Listing want;
  for (int i = 0; i < 150; ++i) {
    ASSERT_TRUE(Insert(*s, i, SizeOf(i)));
    want[Key(i)] = SizeOf(i);
  }
  ASSERT_TRUE(s->Flush().ok());
  // Some more that stay in the filling region buffers.
  for (int i = 150; i < 160; ++i) {
    ASSERT_TRUE(Insert(*s, i, SizeOf(i)));
    want[Key(i)] = SizeOf(i);
  }
  EXPECT_EQ(List(*s, All()), want);
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_list_entries_total"), 160);
  EXPECT_GT(metrics_.ValueOf("kvpool_ssd_list_read_bytes_total"), 0);

  // The filter sees KeyId::hi; only what passes is listed.
  Listing odd;
  for (const auto& [k, n] : want) {
    if (k.hi & 1) odd[k] = n;
  }
  ASSERT_GT(odd.size(), 0u);
  ASSERT_LT(odd.size(), want.size());
  EXPECT_EQ(List(*s, [](uint64_t hi) { return (hi & 1) != 0; }), odd);
}

TEST_F(SsdListTest, OutdatedRemovedAndReclaimedEntriesAreNotListed) {
  // 4 regions of 1 MiB, three 300 KiB records each.
  auto s = Open(Options(1, kSuperblockBytes + (4 << 20)));
  ASSERT_NE(s, nullptr);
  constexpr size_t kThird = 300 << 10;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Insert(*s, i, kThird));
  // Key 1 removed; key 2 removed and put again with another size (its old
  // record stays on disk, outdated).
  s->Remove(Key(1));
  s->Remove(Key(2));
  ASSERT_TRUE(Insert(*s, 2, 1000));
  // Key 20 twice in one region: listed once, as its newer record.
  ASSERT_TRUE(Insert(*s, 20, 500));
  s->Remove(Key(20));
  ASSERT_TRUE(Insert(*s, 20, 700));
  Listing want = {{Key(0), kThird}, {Key(2), 1000},   {Key(3), kThird},
                  {Key(4), kThird}, {Key(5), kThird}, {Key(20), 700}};
  EXPECT_EQ(List(*s, All()), want);  // key 20's region still in its buffer
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(List(*s, All()), want);

  // Two more regions' worth fill the file, a third reclaims the oldest
  // region (key 0, removed key 1, key 2's old copy): key 0 is gone from the
  // index and from the listing.
  for (int i = 10; i < 19; ++i) ASSERT_TRUE(Insert(*s, i, kThird));
  ASSERT_TRUE(s->Flush().ok());
  Listing after;
  for (int i : {0, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 20}) {
    auto n = s->Lookup(Key(i));
    if (n.ok()) after[Key(i)] = *n;
  }
  EXPECT_EQ(after.count(Key(0)), 0u);
  EXPECT_GE(s->GetStats().region_evictions, 1u);
  EXPECT_EQ(List(*s, All()), after);
}

TEST_F(SsdListTest, ListsWhatARestartRecovered) {
  SsdOptions o = Options(2, 2 * (kSuperblockBytes + (8 << 20)));
  Listing want;
  {
    auto s = Open(o);
    ASSERT_NE(s, nullptr);
    for (int i = 0; i < 60; ++i) {
      ASSERT_TRUE(Insert(*s, i, SizeOf(i)));
      want[Key(i)] = SizeOf(i);
    }
    s->Remove(Key(7));
    want.erase(Key(7));
    ASSERT_TRUE(s->Close().ok());  // checkpoint
  }
  {
    auto s = Open(o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->GetStats().recovery, "checkpoint");
    EXPECT_EQ(List(*s, All()), want);
    ASSERT_TRUE(s->Flush().ok());
  }  // dropped without Close: the next start scans
  auto s = Open(o);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->GetStats().recovery, "scan");
  EXPECT_EQ(List(*s, All()), want);
}

TEST_F(SsdListTest, SinkStopsTheListing) {
  auto s = Open(Options(1, kSuperblockBytes + (8 << 20)));
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Insert(*s, i, 200 << 10));  // several regions
  ASSERT_TRUE(s->Flush().ok());
  int batches = 0;
  uint64_t n = s->ListEntries(All(), [&](const std::vector<SsdEntry>&) {
    ++batches;
    return false;
  });
  EXPECT_EQ(batches, 1);
  EXPECT_GT(n, 0u);
  EXPECT_LT(n, 40u);
}

// A read error lists none of that read's records (they are not dropped).
TEST_F(SsdListTest, ReadErrorsListNothingWrong) {
  auto s = Open(Options(1, kSuperblockBytes + (8 << 20)));
  ASSERT_NE(s, nullptr);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Insert(*s, i, 100 << 10));
  ASSERT_TRUE(s->Flush().ok());
  faults_->SetReadErrorProbability(1.0);
  uint64_t n = 1;
  EXPECT_TRUE(List(*s, All(), &n).empty());
  EXPECT_EQ(n, 0u);
  faults_->SetReadErrorProbability(0);
  EXPECT_EQ(List(*s, All()).size(), 20u);
}

// Collects what the drop listener is told (on the flush path).
struct Drops {
  std::mutex mu;
  Listing got;
  int calls = 0;
  SsdDropListener Listener() {
    return [this](const std::vector<SsdEntry>& gone) {
      std::lock_guard lock(mu);
      ++calls;
      for (const SsdEntry& e : gone) EXPECT_TRUE(got.emplace(e.key, e.size).second);
    };
  }
};

// A store without an executor (nothing is written until Flush(), so the
// order of reclaims and region writes is exact), telling its drops to *drops.
std::unique_ptr<SsdStore> OpenUnflushed(const SsdOptions& o, MetricsRegistry* metrics,
                                        Drops* drops) {
  auto opened = SsdStore::Open(o, metrics, nullptr);
  if (!opened.ok()) return nullptr;
  (*opened)->SetDropListener(drops->Listener());
  return std::move(opened).value();
}

TEST_F(SsdListTest, ReclaimedRegionsReportTheirLiveEntries) {
  constexpr size_t kThird = 300 << 10;
  Drops drops;
  auto store = OpenUnflushed(Options(1, kSuperblockBytes + (4 << 20)), &metrics_, &drops);
  ASSERT_NE(store, nullptr);
  SsdStore& s = *store;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Insert(s, i, kThird));  // regions A, B
  s.Remove(Key(1));  // explicit: the caller knows, never reported
  ASSERT_TRUE(s.Flush().ok());
  // C and D fill up, then A and B are reclaimed for 12..17.
  for (int i = 6; i < 18; ++i) ASSERT_TRUE(Insert(s, i, kThird)) << i;
  // Key 0, reclaimed with A, is stored again before A's space is written:
  // held again, so not reported.
  ASSERT_TRUE(Insert(s, 0, 1000));
  EXPECT_EQ(drops.calls, 0);  // nothing reported before the writes
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(s.GetStats().region_evictions, 2u);
  Listing want = {{Key(2), kThird}, {Key(3), kThird}, {Key(4), kThird}, {Key(5), kThird}};
  EXPECT_EQ(drops.got, want);
  for (const auto& [k, n] : want) EXPECT_FALSE(s.Lookup(k).ok());
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_drops_reported_total"), 4);

  // Cleared: reclaims report nothing.
  s.SetDropListener(nullptr);
  for (int i = 20; i < 26; ++i) ASSERT_TRUE(Insert(s, i, kThird)) << i;
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(drops.got, want);
}

// Small records (here 40 per 1 MiB region, over the 16 that one per 64 KiB
// allows) are not read back before a rewrite: nothing is reported, and the
// count says so.
TEST_F(SsdListTest, ReclaimedRegionsOfManySmallRecordsAreCountedNotReported) {
  constexpr size_t kSmall = 25 << 10;
  Drops drops;
  auto store = OpenUnflushed(Options(1, kSuperblockBytes + (4 << 20)), &metrics_, &drops);
  ASSERT_NE(store, nullptr);
  SsdStore& s = *store;
  int n = 0;
  while (s.GetStats().region_evictions == 0) {
    // Without an executor regions are written by Flush(): when every
    // buffer is full, write them out.
    if (!Insert(s, n, kSmall)) {
      ASSERT_TRUE(s.Flush().ok());
      ASSERT_TRUE(Insert(s, n, kSmall)) << n;
    }
    ++n;
    ASSERT_LT(n, 1000);
  }
  ASSERT_TRUE(s.Flush().ok());
  EXPECT_EQ(drops.calls, 0);
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_drops_reported_total"), 0);
  // Every record of the reclaimed region was live: all of them are counted.
  size_t gone = 0;
  for (int i = 0; i < n; ++i) gone += s.Lookup(Key(i)).ok() ? 0 : 1;
  EXPECT_GT(gone, 16u);
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_drops_unreported_total"), static_cast<double>(gone));
}

TEST_F(SsdListTest, ARegionLostToAFailedWriteReportsItsEntries) {
  Drops drops;
  auto store = OpenUnflushed(Options(1, kSuperblockBytes + (4 << 20)), &metrics_, &drops);
  ASSERT_NE(store, nullptr);
  SsdStore& s = *store;
  Listing want;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Insert(s, i, SizeOf(i)));
    want[Key(i)] = SizeOf(i);
  }
  faults_->SetWriteErrorProbability(1.0);
  (void)s.Flush();
  EXPECT_EQ(drops.got, want);
  for (const auto& [k, n] : want) EXPECT_FALSE(s.Lookup(k).ok());
}

}  // namespace
}  // namespace kvpool::ssd::testing
