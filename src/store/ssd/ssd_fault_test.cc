// Device errors and a full disk under the SSD tier (RELIABILITY A6, A7).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "store/ssd/ssd_test_util.h"

namespace kvpool::ssd::testing {
namespace {

using SsdFaultTest = SsdFixture;

constexpr uint64_t kCap = kSuperblockBytes + 16 * (1 << 20);

TEST_F(SsdFaultTest, ReadErrorIsACountedMissAndDropsTheEntry) {
  auto s = Open(Options(1, kCap));
  auto v = Value(1, 10000);
  ASSERT_TRUE(s->Insert(Key(1), v.data(), v.size()));
  ASSERT_TRUE(s->Flush().ok());
  faults_->SetReadErrorProbability(1);
  EXPECT_EQ(s->Read(Key(1), v.data(), v.size()).code(), StatusCode::kIOError);
  EXPECT_FALSE(s->Contains(Key(1)));
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_read_errors_total"), 1);
}

TEST_F(SsdFaultTest, BitFlipsOnReadNeverReturnWrongBytes) {
  auto s = Open(Options(1, kCap));
  for (int i = 0; i < 500; ++i) {
    auto v = Value(i, 8000);
    ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size()));
  }
  ASSERT_TRUE(s->Flush().ok());
  faults_->SetBitFlipProbability(1);  // every read: one bit, somewhere in the window read
  int corrupt = 0, ok = 0;
  for (int i = 0; i < 500; ++i) {
    Status st = ReadCheck(*s, i, 8000);
    ok += st.ok();
    corrupt += st.code() == StatusCode::kCorruption;
  }
  EXPECT_EQ(ok + corrupt, 500);
  EXPECT_EQ(s->GetStats().crc_failures, static_cast<uint64_t>(corrupt));
  // 8,064-byte records read through 12 KiB windows: most flips land in them.
  EXPECT_GT(corrupt, 250);
}

TEST_F(SsdFaultTest, PersistentWriteErrorsTakeTheTierOffline) {
  auto s = Open(Options(1, kCap));
  auto v = Value(1, 10000);
  ASSERT_TRUE(s->Insert(Key(1), v.data(), v.size()));
  ASSERT_TRUE(s->Flush().ok());
  faults_->SetWriteErrorProbability(1);
  for (int i = 100; i < 140; ++i) {
    auto w = Value(i, 300 << 10);
    s->Insert(Key(i), w.data(), w.size());
  }
  (void)s->Flush();
  SsdStats st = s->GetStats();
  EXPECT_FALSE(st.online);
  EXPECT_NE(st.offline_reason.find("write"), std::string::npos) << st.offline_reason;
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_online"), 0);
  EXPECT_FALSE(s->Insert(Key(2), v.data(), v.size()));
  EXPECT_GT(s->GetStats().inserts_dropped, 0u);
  EXPECT_TRUE(ReadCheck(*s, 1, 10000).ok());  // what is on the device still reads
  for (int i = 100; i < 140; ++i) EXPECT_FALSE(s->Contains(Key(i)));
  ASSERT_TRUE(s->Close().ok() || true);
}

TEST_F(SsdFaultTest, FullDiskDropsInsertsThenResumesWhenSpaceFrees) {
  ManualClock clock;
  SsdOptions o = Options(1, kCap);
  o.clock = &clock;
  auto s = Open(o);
  faults_->SetSpaceLeft(2 << 20);  // two region writes fit
  int accepted = 0;
  for (int i = 0; i < 30; ++i) {
    auto v = Value(i, 300 << 10);
    accepted += s->Insert(Key(i), v.data(), v.size());
    if (i % 3 == 2) (void)s->Flush();
  }
  SsdStats st = s->GetStats();
  EXPECT_TRUE(st.online);  // a full disk is not a broken one
  EXPECT_GT(st.inserts_dropped, 0u);
  EXPECT_EQ(st.writes, 2u);
  EXPECT_GE(faults_->enospc_errors(), 1u);
  // Space frees: writes resume once the pause (1 s) is over, not before.
  faults_->SetSpaceLeft(UINT64_MAX);
  auto v = Value(1000, 300 << 10);
  clock.Advance(std::chrono::milliseconds(999));
  EXPECT_FALSE(s->Insert(Key(1000), v.data(), v.size()));
  clock.Advance(std::chrono::milliseconds(1));
  ASSERT_TRUE(s->Insert(Key(1000), v.data(), v.size()));
  ASSERT_TRUE(s->Flush().ok());
  EXPECT_GE(s->GetStats().writes, 3u);
  EXPECT_TRUE(ReadCheck(*s, 1000, 300 << 10).ok());
}

}  // namespace
}  // namespace kvpool::ssd::testing
