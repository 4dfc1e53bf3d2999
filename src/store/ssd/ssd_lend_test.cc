// The SSD tier's demotion without a copy (SsdStore::InsertLent): what it
// holds and for how long, what it reads from where, and what survives a
// kill or a torn write.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "store/ssd/file_device.h"
#include "store/ssd/ssd_test_util.h"

namespace kvpool::ssd::testing {
namespace {

// A value's source bytes, 4 KiB-aligned (as a DRAM slot is).
struct Source {
  explicit Source(int i, size_t n) : n(n) {
    void* m = nullptr;
    EXPECT_EQ(posix_memalign(&m, 4096, n), 0);
    p = static_cast<uint8_t*>(m);
    const auto v = Value(i, n);
    std::memcpy(p, v.data(), n);
  }
  ~Source() { std::free(p); }
  void Scribble() { std::memset(p, 0xEE, n); }
  uint8_t* p;
  size_t n;
};

class SsdLendTest : public SsdFixture {
 protected:
  // What InsertLent takes: counts its release.
  std::function<std::shared_ptr<void>()> Take() {
    return [this] {
      ++taken_;
      return std::shared_ptr<void>(static_cast<void*>(&released_), [this](void*) { ++released_; });
    };
  }
  std::vector<std::unique_ptr<Source>> Sources(int from, int to, size_t n) {
    std::vector<std::unique_ptr<Source>> v;
    for (int i = from; i < to; ++i) v.push_back(std::make_unique<Source>(i, n));
    return v;
  }
  uint64_t Lent(const char* mode) {
    return metrics_.GetCounter("kvpool_ssd_lent_records_total", "", {{"mode", mode}})->Value();
  }
  std::atomic<int> taken_{0}, released_{0};
};

TEST_F(SsdLendTest, CopyModeReadableAtOnceReleasedAfterTheCopyAndDurable) {
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (1 << 20));
  const size_t n = 50000;
  auto src = Sources(0, 30, n);
  {
    // No executor: nothing is copied or written until Flush, so what is
    // held is exact.
    auto s = SsdStore::Open(o, &metrics_, nullptr);
    ASSERT_TRUE(s.ok());
    const LendTerms terms{false, 2 * n};
    EXPECT_EQ((*s)->InsertLent(Key(0), src[0]->p, n, terms, Take()), LendResult::kLent);
    EXPECT_EQ((*s)->InsertLent(Key(1), src[1]->p, n, terms, Take()), LendResult::kLent);
    // Past the limit: refused, nothing taken.
    EXPECT_EQ((*s)->InsertLent(Key(2), src[2]->p, n, terms, Take()), LendResult::kRefused);
    EXPECT_EQ((*s)->InsertLent(Key(0), src[0]->p, n, terms, Take()), LendResult::kAlreadyStored);
    EXPECT_EQ(taken_, 2);
    EXPECT_EQ((*s)->GetStats().lent_bytes, 2 * n);
    // Readable at once, from where the bytes are.
    ASSERT_TRUE(ReadCheck(**s, 0, n).ok());
    ASSERT_TRUE((*s)->Flush().ok());
    EXPECT_EQ(released_, 2);
    EXPECT_EQ((*s)->GetStats().lent_bytes, 0u);
    const LendTerms wide{false, 1ull << 30};
    for (int i = 2; i < 30; ++i) {
      ASSERT_EQ((*s)->InsertLent(Key(i), src[i]->p, n, wide, Take()), LendResult::kLent) << i;
    }
    ASSERT_TRUE((*s)->Flush().ok());
    EXPECT_EQ(released_, 30);
    EXPECT_EQ(Lent("copy"), 30u);
    // Released: the store never reads the sources again.
    for (auto& x : src) x->Scribble();
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(ReadCheck(**s, i, n).ok()) << i;
  }  // a kill: no checkpoint
  auto s = Open(o);
  EXPECT_EQ(s->GetStats().recovery, "scan");
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(ReadCheck(*s, i, n).ok()) << i;
}

TEST_F(SsdLendTest, CopyJobsReleaseBeforeTheRegionFills) {
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (1 << 20), 4 << 20);
  auto s = Open(o);  // with the fixture's thread pool
  const size_t n = 20000;
  auto src = Sources(0, 10, n);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(s->InsertLent(Key(i), src[i]->p, n, {false, 1ull << 30}, Take()), LendResult::kLent);
  }
  // 200 KB in a 4 MiB region: it is not sealed, yet the copy job gives
  // every hold back.
  for (int k = 0; k < 500 && released_ < 10; ++k) usleep(2000);
  EXPECT_EQ(released_, 10);
  EXPECT_EQ(s->GetStats().lent_bytes, 0u);
  for (auto& x : src) x->Scribble();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(ReadCheck(*s, i, n).ok()) << i;
  ASSERT_TRUE(s->Close().ok());
  auto t = Open(o);
  EXPECT_EQ(t->GetStats().recovery, "checkpoint");
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(ReadCheck(*t, i, n).ok()) << i;
}

// On real files (O_DIRECT, io_uring): gather records are written from their
// sources, which stay held until their region is on disk.
TEST_F(SsdLendTest, GatherWritesFromTheSourceAndHoldsItUntilTheRegionIsWritten) {
  const std::string dir = ::testing::TempDir() + "/kvpool-lend-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  SsdOptions o;
  o.dirs = {dir};
  o.capacity_bytes = kSuperblockBytes + 16 * (4 << 20);
  o.region_bytes = 4 << 20;
  o.buffers_per_dir = 4;
  o.device_factory = FileDeviceFactory();
  // Sizes with a tail (not whole blocks), some under the gather minimum.
  std::vector<size_t> sizes;
  for (int i = 0; i < 12; ++i) sizes.push_back(i % 4 == 3 ? 70000 : 300000 + i * 4099);
  std::vector<std::unique_ptr<Source>> src;
  for (int i = 0; i < 12; ++i) src.push_back(std::make_unique<Source>(i, sizes[i]));
  {
    auto s = SsdStore::Open(o, &metrics_, nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 12; ++i) {
      ASSERT_EQ((*s)->InsertLent(Key(i), src[i]->p, sizes[i], {true, 1ull << 30}, Take()),
                LendResult::kLent);
    }
    EXPECT_EQ(Lent("gather"), 9u);
    EXPECT_EQ(Lent("copy"), 3u);
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(ReadCheck(**s, i, sizes[i]).ok()) << i;
    EXPECT_EQ(released_, 0);
    ASSERT_TRUE((*s)->Flush().ok());
    EXPECT_EQ(released_, 12);
    EXPECT_EQ((*s)->GetStats().lent_bytes, 0u);
    for (auto& x : src) x->Scribble();
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(ReadCheck(**s, i, sizes[i]).ok()) << i;
  }  // a kill: the next start scans, over the padding before gather headers
  {
    auto s = SsdStore::Open(o, &metrics_, nullptr);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->GetStats().recovery, "scan");
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(ReadCheck(**s, i, sizes[i]).ok()) << i;
    ASSERT_TRUE((*s)->Close().ok());
  }
  std::filesystem::remove_all(dir);
}

// Past max_gathered_bytes held by gather records, values are lent for a
// copy; a region write done gives the gathered bytes back.
TEST_F(SsdLendTest, PastTheGatherLimitValuesAreLentForACopy) {
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (4 << 20), 4 << 20);
  const size_t n = 300 << 10;
  auto src = Sources(0, 8, n);
  auto s = SsdStore::Open(o, &metrics_, nullptr);  // no executor: nothing moves until Flush
  ASSERT_TRUE(s.ok());
  LendTerms terms{true, 1ull << 30};
  terms.max_gathered_bytes = 2 * n;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ((*s)->InsertLent(Key(i), src[i]->p, n, terms, Take()), LendResult::kLent) << i;
  }
  EXPECT_EQ(Lent("gather"), 2u);
  EXPECT_EQ(Lent("copy"), 2u);
  EXPECT_EQ((*s)->GetStats().lent_bytes, 4 * n);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ReadCheck(**s, i, n).ok()) << i;
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_EQ(released_, 4);
  EXPECT_EQ((*s)->GetStats().lent_bytes, 0u);
  // Written: the limit is free again.
  for (int i = 4; i < 8; ++i) {
    ASSERT_EQ((*s)->InsertLent(Key(i), src[i]->p, n, terms, Take()), LendResult::kLent) << i;
  }
  EXPECT_EQ(Lent("gather"), 4u);
  EXPECT_EQ(Lent("copy"), 4u);
  ASSERT_TRUE((*s)->Flush().ok());
  for (auto& x : src) x->Scribble();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(ReadCheck(**s, i, n).ok()) << i;
  ASSERT_TRUE((*s)->Close().ok());
}

// A crash while a gather write is torn: what was flushed before is whole,
// the torn region's records are exact or gone, never wrong.
TEST_F(SsdLendTest, TornGatherWriteLosesOnlyWhatWasNotFlushed) {
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (2 << 20), 2 << 20);
  const size_t n = 300000;
  auto src = Sources(0, 12, n);
  bool wrong = false;
  {
    auto s = SsdStore::Open(o, &metrics_, nullptr);
    ASSERT_TRUE(s.ok());
    for (int i = 0; i < 6; ++i) {
      ASSERT_EQ((*s)->InsertLent(Key(i), src[i]->p, n, {true, 1ull << 30}, Take()),
                LendResult::kLent);
    }
    ASSERT_TRUE((*s)->Flush().ok());
    faults_->SetTornWriteBytes(8 << 10);  // each piece of the next writes: 8 KiB of it
    for (int i = 6; i < 12; ++i) {
      ASSERT_EQ((*s)->InsertLent(Key(i), src[i]->p, n, {true, 1ull << 30}, Take()),
                LendResult::kLent);
    }
    (void)(*s)->Flush();
    EXPECT_EQ(released_, 12);
  }
  faults_->SetTornWriteBytes(0);
  auto s = Open(o);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(ReadCheck(*s, i, n, &wrong).ok()) << i;
  int lost = 0;
  for (int i = 6; i < 12; ++i) {
    Status st = ReadCheck(*s, i, n, &wrong);
    if (!st.ok()) {
      ++lost;
      EXPECT_TRUE(st.code() == StatusCode::kCorruption || st.code() == StatusCode::kNotFound)
          << st.ToString();
    }
  }
  EXPECT_GT(lost, 0);
  EXPECT_FALSE(wrong);
}

}  // namespace
}  // namespace kvpool::ssd::testing
