#include "store/ssd/ssd_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "store/ssd/file_device.h"
#include "store/ssd/ssd_test_util.h"

namespace kvpool::ssd::testing {
namespace {

using SsdStoreTest = SsdFixture;

// 300 KiB values: exactly three records fit a 1 MiB region.
constexpr size_t kThird = 300 << 10;

TEST_F(SsdStoreTest, RoundTripAcrossRegionsAndDirs) {
  auto s = Open(Options(2, 2 * (kSuperblockBytes + (16 << 20))));
  ASSERT_NE(s, nullptr);
  std::mt19937 rng(1);
  std::vector<size_t> sizes;
  for (int i = 0; i < 120; ++i) {
    sizes.push_back(1 + rng() % (200 << 10));
    auto v = Value(i, sizes[i]);
    ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size()));
  }
  ASSERT_TRUE(s->Flush().ok());
  for (int i = 0; i < 120; ++i) {
    auto n = s->Lookup(Key(i));
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(*n, sizes[i]);
    ASSERT_TRUE(ReadCheck(*s, i, sizes[i]).ok()) << i;
  }
  SsdStats st = s->GetStats();
  EXPECT_EQ(st.entries, 120u);
  EXPECT_EQ(st.reads, 120u);
  ASSERT_EQ(st.dirs.size(), 2u);
  EXPECT_GT(st.dirs[0].writes, 0u);
  EXPECT_GT(st.dirs[1].writes, 0u);
  EXPECT_EQ(st.crc_failures, 0u);
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_entries"), 120);
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_online"), 1);
}

TEST_F(SsdStoreTest, ReadsFromBufferBeforeFlush) {
  SsdOptions o = Options(1, kSuperblockBytes + (8 << 20));
  auto s = SsdStore::Open(o, &metrics_, nullptr);  // no executor: nothing flushes by itself
  ASSERT_TRUE(s.ok());
  auto v = Value(1, 5000);
  ASSERT_TRUE((*s)->Insert(Key(1), v.data(), v.size()));
  EXPECT_TRUE(ReadCheck(**s, 1, 5000).ok());
  EXPECT_EQ((*s)->GetStats().writes, 0u);
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_EQ((*s)->GetStats().writes, 1u);
  EXPECT_TRUE(ReadCheck(**s, 1, 5000).ok());
}

// TryInsert (demotion under the DRAM lock) never waits for a region write;
// WaitForRoom waits for one and then an insert fits.
TEST_F(SsdStoreTest, TryInsertNeverWaitsWaitForRoomDoes) {
  SsdOptions o = Options(1, kSuperblockBytes + (16 << 20));
  o.buffers_per_dir = 2;
  o.insert_wait = std::chrono::seconds(5);
  auto s = Open(o);
  ASSERT_NE(s, nullptr);
  faults_->SetLatencyMicros(300'000);  // every region write takes 0.3 s
  using SteadyClock = std::chrono::steady_clock;
  auto secs = [](SteadyClock::time_point t0) {
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
  };
  // Two buffers of three records: the seventh finds both being written.
  std::vector<std::vector<uint8_t>> v;
  for (int i = 0; i < 7; ++i) v.push_back(Value(i, kThird));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s->TryInsert(Key(i), v[i].data(), kThird)) << i;
  auto t0 = SteadyClock::now();
  EXPECT_FALSE(s->TryInsert(Key(6), v[6].data(), kThird));
  EXPECT_LT(secs(t0), 0.1);
  EXPECT_EQ(s->GetStats().inserts_dropped, 1u);
  t0 = SteadyClock::now();
  EXPECT_TRUE(s->WaitForRoom(kThird));
  EXPECT_GT(secs(t0), 0.1);  // it did wait for the first write
  EXPECT_TRUE(s->TryInsert(Key(6), v[6].data(), kThird));
  faults_->SetLatencyMicros(0);
  ASSERT_TRUE(s->Flush().ok());
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(ReadCheck(*s, i, kThird).ok()) << i;
  EXPECT_EQ(s->GetStats().inserts_dropped, 1u);
  // Values that can never be stored, and a closed store: no wait at all.
  t0 = SteadyClock::now();
  EXPECT_FALSE(s->WaitForRoom(o.region_bytes));
  ASSERT_TRUE(s->Close().ok());
  EXPECT_FALSE(s->WaitForRoom(kThird));
  EXPECT_LT(secs(t0), 0.1);
}

TEST_F(SsdStoreTest, FifoReclaimsTheOldestRegion) {
  auto s = Open(Options(1, kSuperblockBytes + 4 * (1 << 20)));
  for (int i = 0; i < 12; ++i) {
    auto v = Value(i, kThird);
    ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size()));
  }
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(s->GetStats().region_evictions, 0u);
  for (int i = 12; i < 15; ++i) {
    auto v = Value(i, kThird);
    ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size()));
  }
  ASSERT_TRUE(s->Flush().ok());
  SsdStats st = s->GetStats();
  EXPECT_EQ(st.region_evictions, 1u);
  EXPECT_EQ(st.entries, 12u);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(s->Contains(Key(i))) << i;
  for (int i = 3; i < 15; ++i) EXPECT_TRUE(ReadCheck(*s, i, kThird).ok()) << i;
}

TEST_F(SsdStoreTest, ReinsertsEntriesReadOften) {
  SsdOptions o = Options(1, kSuperblockBytes + 4 * (1 << 20));
  o.reinsert_min_reads = 2;
  auto s = Open(o);
  for (int i = 0; i < 12; ++i) {
    auto v = Value(i, kThird);
    ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size()));
  }
  ASSERT_TRUE(s->Flush().ok());
  ASSERT_TRUE(ReadCheck(*s, 1, kThird).ok());
  ASSERT_TRUE(ReadCheck(*s, 1, kThird).ok());
  auto v = Value(12, kThird);
  ASSERT_TRUE(s->Insert(Key(12), v.data(), v.size()));  // reclaims keys 0..2
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_FALSE(s->Contains(Key(0)));
  EXPECT_FALSE(s->Contains(Key(2)));
  EXPECT_TRUE(ReadCheck(*s, 1, kThird).ok());
  EXPECT_TRUE(ReadCheck(*s, 12, kThird).ok());
}

TEST_F(SsdStoreTest, FirstValueStaysRemoveAndTooLarge) {
  SsdOptions o = Options(1, kSuperblockBytes + 4 * (1 << 20));
  o.max_value_bytes = 512 << 10;
  auto s = Open(o);
  auto a = Value(1, 1000), b = Value(2, 2000);
  ASSERT_TRUE(s->Insert(Key(1), a.data(), a.size()));
  EXPECT_TRUE(s->Insert(Key(1), b.data(), b.size()));
  EXPECT_EQ(*s->Lookup(Key(1)), 1000u);
  EXPECT_TRUE(ReadCheck(*s, 1, 1000).ok());
  s->Remove(Key(1));
  EXPECT_FALSE(s->Contains(Key(1)));
  EXPECT_EQ(s->Read(Key(1), a.data(), 1000).code(), StatusCode::kNotFound);
  auto big = Value(3, 600 << 10);
  EXPECT_FALSE(s->Insert(Key(3), big.data(), big.size()));
  EXPECT_EQ(s->GetStats().inserts_dropped, 1u);
}

TEST_F(SsdStoreTest, IndexBytesPerEntryAtMostThirtyTwo) {
  auto s = Open(Options(1, kSuperblockBytes + 64 * (1 << 20)));
  for (int i = 0; i < 40000; ++i) {
    auto v = Value(i, 1000);
    ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size()) || s->GetStats().inserts_dropped > 0);
  }
  ASSERT_TRUE(s->Flush().ok());
  SsdStats st = s->GetStats();
  EXPECT_GT(st.entries, 30000u);
  EXPECT_LE(st.index_bytes_per_entry, 32.0);
  // Measured honestly: all index memory over the entries actually held.
  EXPECT_LE(static_cast<double>(st.index_bytes) / st.entries, 48.0);
  RecordProperty("index_bytes_per_entry", std::to_string(st.index_bytes_per_entry));
}

TEST_F(SsdStoreTest, ConcurrentInsertReadVerify) {
  auto s = Open(Options(2, 2 * (kSuperblockBytes + 8 * (1 << 20))));
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::vector<uint8_t> got;
      for (int i = 0; i < 400; ++i) {
        const int k = t * 100000 + i;
        const size_t n = 1000 + (k % 50000);
        auto v = Value(k, n);
        s->Insert(Key(k), v.data(), v.size());
        for (int j = std::max(0, i - 20); j <= i; ++j) {
          const int kk = t * 100000 + j;
          auto len = s->Lookup(Key(kk));
          if (!len.ok()) continue;
          got.resize(*len);
          if (s->Read(Key(kk), got.data(), got.size()).ok()) {
            ++hits;
            if (got != Value(kk, got.size())) ++wrong;
          }
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 1000);
  EXPECT_EQ(s->GetStats().crc_failures, 0u);
}

std::string TempDir() {
  std::string t = "/tmp/kvpool_ssd_XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

TEST(SsdStoreFileTest, RealFilesRoundTripAndCheckpointRestart) {
  for (bool uring : {true, false}) {
    std::string dir = TempDir();
    SsdOptions o;
    o.dirs = {dir + "/a", dir + "/b"};
    o.capacity_bytes = 2 * (kSuperblockBytes + 8 * (1 << 20));
    o.region_bytes = 1 << 20;
    FileDeviceOptions fo;
    fo.use_io_uring = uring;
    o.device_factory = FileDeviceFactory(fo);
    ThreadPool pool(2, "ssd-file");
    {
      auto s = SsdStore::Open(o, nullptr, &pool);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      for (int i = 0; i < 40; ++i) {
        auto v = Value(i, 100000 + i);
        ASSERT_TRUE((*s)->Insert(Key(i), v.data(), v.size()));
      }
      ASSERT_TRUE((*s)->Close().ok());
    }
    auto s = SsdStore::Open(o, nullptr, &pool);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->GetStats().recovery, "checkpoint");
    for (int i = 0; i < 40; ++i) {
      std::vector<uint8_t> got(100000 + i);
      ASSERT_TRUE((*s)->Read(Key(i), got.data(), got.size()).ok()) << i;
      ASSERT_EQ(got, Value(i, got.size()));
    }
    s->reset();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace kvpool::ssd::testing
