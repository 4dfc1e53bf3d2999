// Restart (checkpoint, scan, power cut), incompatible restarts, and damaged
// records found on the device (RELIABILITY A2-A5).
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "store/ssd/ssd_test_util.h"

namespace kvpool::ssd::testing {
namespace {

using SsdRecoveryTest = SsdFixture;

constexpr uint64_t kCap = 2 * (kSuperblockBytes + 16 * (1 << 20));

void Fill(SsdStore& s, int from, int to, size_t n) {
  for (int i = from; i < to; ++i) {
    auto v = Value(i, n);
    ASSERT_TRUE(s.Insert(Key(i), v.data(), v.size())) << i;
  }
}

TEST_F(SsdRecoveryTest, CheckpointThenScanAfterKill) {
  SsdOptions o = Options(2, kCap);
  {
    auto s = Open(o);
    Fill(*s, 0, 200, 20000);
    ASSERT_TRUE(s->Close().ok());
    ASSERT_TRUE(s->Close().ok());  // idempotent
    EXPECT_FALSE(s->Insert(Key(999), Value(1, 10).data(), 10));
  }
  {
    auto s = Open(o);
    EXPECT_EQ(s->GetStats().recovery, "checkpoint");
    EXPECT_EQ(s->GetStats().entries, 200u);
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(ReadCheck(*s, i, 20000).ok()) << i;
  }  // dropped without Close: the checkpoint was consumed, so a scan follows
  auto s = Open(o);
  EXPECT_EQ(s->GetStats().recovery, "scan");
  EXPECT_EQ(s->GetStats().entries, 200u);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(ReadCheck(*s, i, 20000).ok()) << i;
}

// A removal is logged (a tombstone in the record's directory): after a kill
// and a scan, removed keys stay removed, keys put again after their removal
// come back with the new value, the rest are untouched.
TEST_F(SsdRecoveryTest, RemovedKeysStayRemovedAfterKill) {
  SsdOptions o = Options(2, kCap);
  constexpr size_t kN = 20000, kNew = 7000;
  {
    auto s = Open(o);
    Fill(*s, 0, 300, kN);
    ASSERT_TRUE(s->Flush().ok());
    // Removes of records on disk, of records still in the filling buffers,
    // and a remove + put again of the same key (within and across regions).
    for (int i = 0; i < 300; i += 3) s->Remove(Key(i));
    Fill(*s, 300, 330, kN);
    for (int i = 300; i < 330; i += 3) s->Remove(Key(i));
    for (int i = 0; i < 30; i += 3) {
      auto v = Value(i + 1000, kNew);
      ASSERT_TRUE(s->Insert(Key(i), v.data(), v.size())) << i;
    }
    s->Remove(Key(3));  // removed, put again, removed again
    ASSERT_TRUE(s->Flush().ok());
  }  // dropped without Close: the next start scans
  auto s = Open(o);
  EXPECT_EQ(s->GetStats().recovery, "scan");
  int removed = 0;
  for (int i = 0; i < 330; ++i) {
    if (i % 3 != 0) {
      ASSERT_TRUE(ReadCheck(*s, i, kN).ok()) << i;
    } else if (i < 30 && i != 3) {
      auto len = s->Lookup(Key(i));
      ASSERT_TRUE(len.ok()) << i;
      ASSERT_EQ(len.value(), kNew) << i;
      std::vector<uint8_t> got(kNew);
      ASSERT_TRUE(s->Read(Key(i), got.data(), kNew).ok()) << i;
      EXPECT_EQ(got, Value(i + 1000, kNew)) << i;
    } else {
      EXPECT_FALSE(s->Contains(Key(i))) << i;
      removed += !s->Contains(Key(i));
    }
  }
  EXPECT_EQ(removed, 330 / 3 - 9);
  EXPECT_EQ(s->GetStats().entries, 330u - removed);
  EXPECT_EQ(s->GetStats().crc_failures, 0u);
}

TEST_F(SsdRecoveryTest, KillKeepsWhatWasFlushedWithNoHoles) {
  SsdOptions o = Options(1, kSuperblockBytes + 32 * (1 << 20));
  {
    auto s = Open(o);
    Fill(*s, 0, 100, 50000);
    ASSERT_TRUE(s->Flush().ok());
    Fill(*s, 100, 180, 50000);  // some regions written, the last still buffered
  }
  auto s = Open(o);
  EXPECT_EQ(s->GetStats().recovery, "scan");
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(ReadCheck(*s, i, 50000).ok()) << i;
  int present = 0;
  bool hole = false;
  for (int i = 100; i < 180; ++i) {
    bool has = s->Contains(Key(i));
    if (has && present != i - 100) hole = true;
    present += has;
    if (has) {
      ASSERT_TRUE(ReadCheck(*s, i, 50000).ok());
    }
  }
  EXPECT_FALSE(hole);
  EXPECT_LT(present, 80);  // the filling region was lost with the process
}

TEST_F(SsdRecoveryTest, PowerCutDropsOnlyUnsyncedWrites) {
  faults_->SetTrackUnsynced(true);
  SsdOptions o = Options(1, kSuperblockBytes + 32 * (1 << 20));
  {
    auto s = Open(o);
    Fill(*s, 0, 100, 50000);
    ASSERT_TRUE(s->Flush().ok());  // the sync barrier
    Fill(*s, 100, 200, 50000);     // regions written but never synced
  }
  ASSERT_TRUE(faults_->PowerCut().ok());
  faults_->SetTrackUnsynced(false);
  auto s = Open(o);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(ReadCheck(*s, i, 50000).ok()) << i;
  for (int i = 100; i < 200; ++i) EXPECT_FALSE(s->Contains(Key(i))) << i;
}

TEST_F(SsdRecoveryTest, GeometryChangeStartsCold) {
  {
    auto s = Open(Options(1, kSuperblockBytes + 8 * (1 << 20)));
    Fill(*s, 0, 10, 1000);
    ASSERT_TRUE(s->Close().ok());
  }
  auto s = Open(Options(1, kSuperblockBytes + 8 * (1 << 20), 2 << 20));
  SsdStats st = s->GetStats();
  EXPECT_EQ(st.recovery.rfind("cold: ", 0), 0u) << st.recovery;
  EXPECT_NE(st.recovery.find("geometry"), std::string::npos) << st.recovery;
  EXPECT_EQ(st.entries, 0u);
  EXPECT_FALSE(s->Contains(Key(1)));
}

TEST_F(SsdRecoveryTest, FormatVersionChangeIsRefusedOrWipedWhenAskedAndOldRegionsStayDead) {
  SsdOptions o = Options(1, kSuperblockBytes + 8 * (1 << 20));
  {
    auto s = Open(o);
    Fill(*s, 0, 10, 1000);
    ASSERT_TRUE(s->Close().ok());
  }
  File()[4] = 99;  // Superblock::version
  // Refused, saying what and how to go on; the file is left as it was.
  const std::vector<uint8_t> before = File();
  auto refused = SsdStore::Open(o, &metrics_, &pool_);
  ASSERT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg(refused.status().message());
  EXPECT_NE(msg.find("/mem/d0 holds an SSD tier of on-disk format version 99"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(format version 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--ssd-wipe-other-format"), std::string::npos) << msg;
  EXPECT_TRUE(File() == before);
  // Wiped when asked.
  o.wipe_other_format = true;
  {
    auto s = Open(o);
    EXPECT_NE(s->GetStats().recovery.find("format version 99"), std::string::npos)
        << s->GetStats().recovery;
    EXPECT_EQ(s->GetStats().entries, 0u);
  }
  // The reinitialized file has a new uuid: a scan must not pick up the old
  // incarnation's regions.
  auto s = Open(o);
  EXPECT_EQ(s->GetStats().recovery, "scan");
  EXPECT_EQ(s->GetStats().entries, 0u);
}

// Flips bits in `n` records chosen from `found` (and a 4-byte burst in
// half of them); returns the damaged keys.
std::set<int> Damage(std::vector<uint8_t>& file, const std::map<uint64_t, FoundRecord>& found,
                     int keys, int n, size_t value_len, std::mt19937_64& rng) {
  std::set<int> hit;
  while (static_cast<int>(hit.size()) < n) {
    int k = static_cast<int>(rng() % keys);
    if (!hit.insert(k).second) continue;
    const FoundRecord& r = found.at(Key(k).hi);
    const uint64_t span = kRecordHeaderBytes + value_len;
    uint64_t bit = rng() % (span * 8);
    file[r.offset + bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
    if (hit.size() % 2 == 0) {
      uint64_t at = rng() % (span - 4);
      for (int j = 0; j < 4; ++j) file[r.offset + at + j] ^= static_cast<uint8_t>(rng() | 1);
    }
  }
  return hit;
}

void ReadAll(SsdStore& s, int keys, size_t n, const std::set<int>& damaged, int* detected,
             int* untouched_hits) {
  std::vector<uint8_t> got(n);
  for (int i = 0; i < keys; ++i) {
    Status st = s.Read(Key(i), got.data(), n);
    if (st.ok()) {
      ASSERT_EQ(got, Value(i, n)) << "wrong bytes served for key " << i;
      if (!damaged.count(i)) ++*untouched_hits;
    } else if (st.code() == StatusCode::kCorruption) {
      ++*detected;
      EXPECT_TRUE(damaged.count(i)) << i;
      EXPECT_FALSE(s.Contains(Key(i)));  // the entry is dropped
    }
  }
}

TEST_F(SsdRecoveryTest, BitRotOfflineDetectedEveryTime) {
  constexpr int kKeys = 3000, kDamaged = 1000;
  constexpr size_t kLen = 4000;
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (1 << 20));
  {
    auto s = Open(o);
    Fill(*s, 0, kKeys, kLen);
    ASSERT_TRUE(s->Close().ok());
  }
  std::mt19937_64 rng(11);
  auto damaged = Damage(File(), WalkFile(File()), kKeys, kDamaged, kLen, rng);
  auto s = Open(o);
  ASSERT_EQ(s->GetStats().recovery, "checkpoint");
  int detected = 0, untouched = 0;
  ReadAll(*s, kKeys, kLen, damaged, &detected, &untouched);
  EXPECT_EQ(detected, kDamaged);
  EXPECT_EQ(s->GetStats().crc_failures, static_cast<uint64_t>(kDamaged));
  EXPECT_GE(untouched, (kKeys - kDamaged) * 999 / 1000);
}

TEST_F(SsdRecoveryTest, BitRotWhileRunningDetectedEveryTime) {
  constexpr int kKeys = 3000, kDamaged = 1000;
  constexpr size_t kLen = 4000;
  auto s = Open(Options(1, kSuperblockBytes + 16 * (1 << 20)));
  Fill(*s, 0, kKeys, kLen);
  ASSERT_TRUE(s->Flush().ok());
  std::mt19937_64 rng(12);
  auto damaged = Damage(File(), WalkFile(File()), kKeys, kDamaged, kLen, rng);
  int detected = 0, untouched = 0;
  ReadAll(*s, kKeys, kLen, damaged, &detected, &untouched);
  EXPECT_EQ(detected, kDamaged);
  EXPECT_EQ(untouched, kKeys - kDamaged);
}

TEST_F(SsdRecoveryTest, BitRotAfterCrashNeverServesWrongBytes) {
  // Scan recovery skips records whose header is damaged (a plain miss) and
  // catches payload damage at read time.
  constexpr int kKeys = 2000, kDamaged = 500;
  constexpr size_t kLen = 4000;
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (1 << 20));
  {
    auto s = Open(o);
    Fill(*s, 0, kKeys, kLen);
    ASSERT_TRUE(s->Flush().ok());
  }
  std::mt19937_64 rng(13);
  auto damaged = Damage(File(), WalkFile(File()), kKeys, kDamaged, kLen, rng);
  auto s = Open(o);
  ASSERT_EQ(s->GetStats().recovery, "scan");
  int detected = 0, untouched = 0;
  ReadAll(*s, kKeys, kLen, damaged, &detected, &untouched);
  EXPECT_EQ(untouched, kKeys - kDamaged);  // one bad header loses no neighbour
  EXPECT_GT(detected, kDamaged * 9 / 10);
}

TEST_F(SsdRecoveryTest, TornMisplacedAndHeaderOrKeyOnlyCorruption) {
  constexpr size_t kLen = 64 << 10;
  auto s = Open(Options(1, kSuperblockBytes + 16 * (1 << 20)));
  Fill(*s, 0, 40, kLen);
  ASSERT_TRUE(s->Flush().ok());
  auto& f = File();
  auto found = WalkFile(f);
  // Torn: one 4 KiB block inside key 1's payload zeroed.
  const uint64_t torn = AlignUp(found.at(Key(1).hi).offset + 8192, 4096);
  std::memset(&f[torn], 0, 4096);
  // Misplaced: key 2's record copied over key 3's slot (same length), and
  // key 4's over key 30's, which sits in another region.
  std::memcpy(&f[found.at(Key(3).hi).offset], &f[found.at(Key(2).hi).offset],
              kRecordHeaderBytes + kLen);
  std::memcpy(&f[found.at(Key(30).hi).offset], &f[found.at(Key(4).hi).offset],
              kRecordHeaderBytes + kLen);
  // Header only (value_len) and key only (key_lo).
  f[found.at(Key(5).hi).offset + 24] ^= 0x01;
  f[found.at(Key(6).hi).offset + 16] ^= 0x80;
  for (int k : {1, 3, 30, 5, 6}) {
    std::vector<uint8_t> got(kLen);
    EXPECT_EQ(s->Read(Key(k), got.data(), kLen).code(), StatusCode::kCorruption) << k;
  }
  EXPECT_EQ(s->GetStats().crc_failures, 5u);
  for (int k : {0, 2, 4, 7, 29, 31}) EXPECT_TRUE(ReadCheck(*s, k, kLen).ok()) << k;
}

TEST_F(SsdRecoveryTest, TruncatedTailAndTornRegionWrites) {
  // Only the first 64 KiB of each region write reaches the device.
  faults_->SetTornWriteBytes(64 << 10);
  SsdOptions o = Options(1, kSuperblockBytes + 16 * (1 << 20));
  {
    auto s = Open(o);
    Fill(*s, 0, 40, 60000);
    ASSERT_TRUE(s->Flush().ok());
    int corrupt = 0, ok = 0;
    for (int i = 0; i < 40; ++i) {
      std::vector<uint8_t> got(60000);
      Status st = s->Read(Key(i), got.data(), got.size());
      if (st.ok()) {
        ++ok;
        ASSERT_EQ(got, Value(i, 60000));
      } else {
        EXPECT_EQ(st.code(), StatusCode::kCorruption);
        ++corrupt;
      }
    }
    EXPECT_GT(ok, 0);
    EXPECT_GT(corrupt, 0);
  }
  faults_->SetTornWriteBytes(0);
  // Scan: records with an intact header are indexed; one whose payload was
  // cut off fails its CRC when read. Never wrong bytes.
  auto s = Open(o);
  int ok = 0;
  for (int i = 0; i < 40; ++i) {
    Status st = ReadCheck(*s, i, 60000);
    ok += st.ok();
    if (!st.ok()) {
      EXPECT_TRUE(st.code() == StatusCode::kCorruption || st.code() == StatusCode::kNotFound);
    }
  }
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace kvpool::ssd::testing
