// SSD tier: damaged and failing media, against the real kvpool-node. The
// test process finds records in the tier's data file with the layout of
// store/ssd/ssd_format.h and damages them (bit flips, zeroed 4 KiB blocks,
// records copied over other records, a truncated file, a data file that
// cannot be opened), with the node stopped or while it runs. Every get is
// compared byte for byte: a damaged record must read as a counted miss,
// never as wrong bytes, and everything untouched must still hit.
//
// What these tests do not cover: EIO from a real block device (no loop or
// dm-error device here, and the node has no fault-injection flag). The
// store's handling of device EIO, torn writes and latency runs through
// FaultDevice in src/store/ssd/ssd_fault_test.cc; here the closest real
// faults are a truncated file (reads past its end fail: the device read
// error path, seen from the node) and a data path that cannot be opened.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "ssd_test_util.h"
#include "store/ssd/ssd_format.h"

namespace kvpool::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBlock = 4096;

std::vector<uint64_t> Keys(const std::map<uint64_t, RecordLoc>& recs) {
  std::vector<uint64_t> v;
  for (const auto& [i, r] : recs) v.push_back(i);
  return v;
}

class SsdCorruptionTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && node_ != nullptr) {
      std::string log = node_->Log();
      if (log.size() > 6000) log = log.substr(log.size() - 6000);
      std::cerr << "---- node log (tail) ----\n" << log << "\n";
    }
  }
  ~SsdCorruptionTest() override {
    if (client_ != nullptr) kvpool_close(client_);
  }
  void Restart(const std::vector<std::string>& args) {
    std::string log;
    node_ = NodeProcess::Start(args, "", &log);
    ASSERT_NE(node_, nullptr) << "node did not start:\n" << log;
    client_ = OpenClient(node_->socket());
    ASSERT_NE(client_, nullptr) << NodeDiagnosis(*node_);
  }
  int StopNode(int sig) {
    if (client_ != nullptr) kvpool_close(client_);
    client_ = nullptr;
    return node_->Stop(sig);
  }
  double M(const std::string& s) { return MetricOr0(*node_, s); }
  uint64_t Crc() { return SsdStatus(*node_)["crc_failures"].get<uint64_t>(); }

  // Records of w's keys [0, n) in the data file: workload index -> record.
  std::map<uint64_t, RecordLoc> RecordsOf(const Workload& w, uint64_t n) {
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> by_id;
    for (uint64_t i = 0; i < n; ++i) {
      kvpool_key_id id = w.Id(i);
      by_id[{id.hi, id.lo}] = i;
    }
    std::map<uint64_t, RecordLoc> out;
    for (const RecordLoc& r : ParseRecords(DataFile(dir_))) {
      auto it = by_id.find({r.key_hi, r.key_lo});
      if (it == by_id.end()) continue;
      EXPECT_TRUE(r.payload_ok) << "record of k" << it->second << " did not verify before damage";
      EXPECT_EQ(r.value_len, w.Size(it->second));
      EXPECT_EQ(out.count(it->second), 0u) << "two records of k" << it->second;
      out[it->second] = r;
    }
    return out;
  }

  // Flips one payload bit in every `stride`-th record (up to `count`);
  // returns the damaged workload indices.
  std::set<uint64_t> FlipPayloadBits(const std::map<uint64_t, RecordLoc>& recs, uint64_t count) {
    std::set<uint64_t> flipped;
    const uint64_t stride = std::max<uint64_t>(1, recs.size() / count);
    uint64_t k = 0;
    for (const auto& [i, r] : recs) {
      if (flipped.size() == count) break;
      if (k++ % stride != 0) continue;
      const uint64_t at = r.offset + ssd::kRecordHeaderBytes + (i * 7919) % r.value_len;
      FlipBit(DataFile(dir_), at, static_cast<int>(i % 8));
      flipped.insert(i);
    }
    return flipped;
  }

  // What reading every record back after the damage found.
  struct ReadBack {
    uint64_t damaged_hits = 0;   // hits among the damaged records
    uint64_t intact_misses = 0;  // misses among the others
    uint64_t misses = 0;         // all misses
  };

  // Restarts the node, checks that it recovered by `recovery` with every
  // record of recs indexed, and reads each back: never wrong bytes or errors.
  ReadBack RestartAndReadBack(const std::vector<std::string>& args, const std::string& recovery,
                              const Workload& w, const std::map<uint64_t, RecordLoc>& recs,
                              const std::set<uint64_t>& damaged) {
    ReadBack out;
    Restart(args);
    if (HasFatalFailure()) return out;
    nlohmann::json s = SsdStatus(*node_);
    EXPECT_EQ(s["recovery"], recovery);
    EXPECT_EQ(s["entries"].get<uint64_t>(), recs.size());
    std::vector<uint64_t> idx = Keys(recs);
    GetResult r = GetIndices(client_, w, idx);
    EXPECT_EQ(r.wrong, 0u);
    EXPECT_EQ(r.errors, 0u);
    for (size_t k = 0; k < idx.size(); ++k) {
      if (damaged.count(idx[k])) out.damaged_hits += r.hit[k];
      else out.intact_misses += r.hit[k] ? 0 : 1;
    }
    out.misses = r.misses;
    return out;
  }

  TempDir tmp_;
  std::string dir_ = tmp_.path() + "/ssd";
  std::unique_ptr<NodeProcess> node_;
  kvpool_client* client_ = nullptr;
};

// (d, stopped) 1,000 records get one flipped payload bit while the node is
// down after a crash; the restarted node (region scan: headers intact, so
// every record is indexed) detects each on its first read.
TEST_F(SsdCorruptionTest, BitFlipsWhileStoppedAreCountedMisses) {
  const auto args = SsdArgs(dir_, "16MiB", "128MiB", "1MiB");
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload w{"d", 4 << 10, 12 << 10, 21};
  const uint64_t n = w.KeysFor(56 * kMiB);
  ASSERT_EQ(PutRange(client_, w, 0, n, 32), 0u);
  ASSERT_TRUE(Flush(client_));
  StopNode(SIGKILL);

  std::map<uint64_t, RecordLoc> recs = RecordsOf(w, n);
  ASSERT_GE(recs.size(), 3000u) << "too few records on SSD to damage 1,000 of them";
  std::set<uint64_t> flipped = FlipPayloadBits(recs, 1000);
  ASSERT_EQ(flipped.size(), 1000u);

  ReadBack rb;
  ASSERT_NO_FATAL_FAILURE(rb = RestartAndReadBack(args, "scan", w, recs, flipped));
  EXPECT_EQ(rb.damaged_hits, 0u);
  const uint64_t untouched = recs.size() - flipped.size();
  EXPECT_LE(rb.intact_misses, untouched / 1000) << rb.intact_misses << " of " << untouched;
  EXPECT_EQ(Crc(), 1000u);
  EXPECT_EQ(M("kvpool_ssd_crc_failures_total"), 1000);
  // The dropped entries are gone for good: a second read is a plain miss.
  std::vector<uint64_t> again(flipped.begin(), flipped.end());
  GetResult r2 = GetIndices(client_, w, again);
  EXPECT_EQ(r2.hits + r2.wrong, 0u);
  EXPECT_EQ(Crc(), 1000u);
  // Keys that were only in DRAM at the crash miss; none returns wrong bytes.
  std::vector<uint64_t> rest;
  for (uint64_t i = 0; i < n; ++i) {
    if (!recs.count(i)) rest.push_back(i);
  }
  GetResult r3 = GetIndices(client_, w, rest);
  EXPECT_EQ(r3.hits + r3.wrong + r3.errors, 0u);
}

// (d, running) The same damage while the node runs. The damaged keys were
// pushed out of DRAM first (and every read of them is checked to have gone
// to SSD: promotions + promotion failures == keys read), so the flipped
// bits are on the node's read path (O_DIRECT reads see the test's pwrite).
TEST_F(SsdCorruptionTest, BitFlipsWhileRunningAreCountedMisses) {
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dir_, "16MiB", "128MiB", "1MiB", {"--ssd-buffers", "16"})));
  Workload cold{"dr", 4 << 10, 12 << 10, 22};
  Workload filler{"dr-fill", 64 << 10, 256 << 10, 23};
  const uint64_t n = cold.KeysFor(32 * kMiB);
  ASSERT_EQ(PutRange(client_, cold, 0, n, 32, 8 * kMiB), 0u);
  const uint64_t nf = filler.KeysFor(48 * kMiB);  // 3x DRAM: evicts every cold key
  ASSERT_EQ(PutRange(client_, filler, 0, nf, 8, 8 * kMiB), 0u);
  ASSERT_TRUE(Flush(client_));
  ASSERT_EQ(M("kvpool_tier_demotions_dropped_total"), 0);

  std::map<uint64_t, RecordLoc> recs = RecordsOf(cold, n);
  ASSERT_EQ(recs.size(), n) << "every cold key should be on SSD";
  std::set<uint64_t> flipped = FlipPayloadBits(recs, 1000);
  ASSERT_EQ(flipped.size(), 1000u);

  const double p0 = M("kvpool_tier_promotions_total");
  const double f0 = M("kvpool_tier_promotion_failures_total");
  std::vector<uint64_t> idx = Keys(recs);
  GetResult r = GetIndices(client_, cold, idx);
  EXPECT_EQ(M("kvpool_tier_promotions_total") - p0 + M("kvpool_tier_promotion_failures_total") - f0,
            static_cast<double>(idx.size()))
      << "some reads were served from DRAM, not from the damaged file";
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
  uint64_t flipped_hits = 0, untouched_misses = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    if (flipped.count(idx[k])) flipped_hits += r.hit[k];
    else untouched_misses += r.hit[k] ? 0 : 1;
  }
  EXPECT_EQ(flipped_hits, 0u);
  const uint64_t untouched = recs.size() - flipped.size();
  EXPECT_LE(untouched_misses, untouched / 1000) << untouched_misses << " of " << untouched;
  EXPECT_EQ(Crc(), 1000u);
  EXPECT_EQ(M("kvpool_tier_promotion_failures_total") - f0, 1000);
}

// (e) Torn and misplaced records, node stopped cleanly (so the checkpoint
// still indexes them and the damage meets the read path):
//  - a zeroed 4 KiB block inside a payload (a torn write),
//  - a zeroed 4 KiB block holding a record header (and the previous
//    record's tail),
//  - a valid record of another key copied over a record's position (a
//    misdirected write; same or smaller length, so only the target breaks).
// Each damaged record is a counted miss; the copied record's key still hits
// with its own bytes; nothing returns another key's value.
TEST_F(SsdCorruptionTest, TornAndMisplacedRecordsAreCountedMisses) {
  const auto args = SsdArgs(dir_, "16MiB", "128MiB", "1MiB");
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload w{"e", 16 << 10, 48 << 10, 24};
  const uint64_t n = w.KeysFor(64 * kMiB);
  ASSERT_EQ(PutRange(client_, w, 0, n, 16), 0u);
  int st = StopNode(SIGTERM);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);

  std::map<uint64_t, RecordLoc> recs = RecordsOf(w, n);
  ASSERT_GE(recs.size(), 600u);
  std::vector<std::pair<uint64_t, RecordLoc>> list(recs.begin(), recs.end());
  std::sort(list.begin(), list.end(),
            [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
  const std::string file = DataFile(dir_);
  std::set<uint64_t> damaged;
  // Records whose [offset, end) has non-zero bytes inside [lo, hi): those a
  // zeroed range breaks.
  auto zero_range = [&](uint64_t lo, uint64_t hi) {
    std::vector<uint8_t> before = ReadAt(file, lo, hi - lo);
    for (const auto& [i, r] : list) {
      uint64_t a = std::max(lo, r.offset), b = std::min(hi, r.end());
      if (a >= b) continue;
      bool nonzero = false;
      for (uint64_t x = a; x < b && !nonzero; ++x) nonzero = before[x - lo] != 0;
      if (nonzero) damaged.insert(i);
    }
    WriteAt(file, lo, std::vector<uint8_t>(hi - lo, 0));
  };
  std::set<uint64_t> touched_blocks;  // keep the kinds of damage apart
  auto block_free = [&](uint64_t lo, uint64_t hi) {
    for (uint64_t b = lo / kBlock; b <= (hi - 1) / kBlock; ++b) {
      if (touched_blocks.count(b) || touched_blocks.count(b - 1) || touched_blocks.count(b + 1)) {
        return false;
      }
    }
    return true;
  };
  auto touch = [&](uint64_t lo, uint64_t hi) {
    for (uint64_t b = lo / kBlock; b <= (hi - 1) / kBlock; ++b) touched_blocks.insert(b);
  };
  uint64_t torn_payload = 0, torn_header = 0, misplaced = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    const auto& [i, r] = list[k];
    if (k % 12 == 0 && torn_payload < 50) {
      const uint64_t lo = ssd::AlignUp(r.offset + ssd::kRecordHeaderBytes, kBlock);
      if (lo + kBlock <= r.end() && block_free(lo, lo + kBlock)) {
        zero_range(lo, lo + kBlock);
        touch(lo, lo + kBlock);
        ++torn_payload;
      }
    } else if (k % 12 == 4 && torn_header < 30) {
      const uint64_t lo = ssd::AlignDown(r.offset, kBlock);
      // Not the block with the region header: the checkpoint path does not
      // reread region headers, the scan path would drop the whole region.
      const uint64_t region_lo = (r.offset - ssd::kSuperblockBytes) / kMiB * kMiB + ssd::kSuperblockBytes;
      if (lo > region_lo && block_free(lo, lo + kBlock)) {
        zero_range(lo, lo + kBlock);
        touch(lo, lo + kBlock);
        ++torn_header;
      }
    } else if (k % 12 == 8 && misplaced < 30 && k + 6 < list.size()) {
      // Copy a later, not longer, undamaged record over this one.
      for (size_t j = k + 1; j < k + 6; ++j) {
        const auto& [xi, x] = list[j];
        if (x.value_len > r.value_len || damaged.count(xi) || !block_free(r.offset, r.end()) ||
            !block_free(x.offset, x.end())) {
          continue;
        }
        WriteAt(file, r.offset, ReadAt(file, x.offset, x.end() - x.offset));
        touch(r.offset, r.end());
        touch(x.offset, x.end());
        damaged.insert(i);
        ++misplaced;
        break;
      }
    }
  }
  ASSERT_EQ(torn_payload, 50u);
  ASSERT_EQ(torn_header, 30u);
  ASSERT_GE(misplaced, 20u);

  ReadBack rb;
  ASSERT_NO_FATAL_FAILURE(rb = RestartAndReadBack(args, "checkpoint", w, recs, damaged));
  EXPECT_EQ(rb.damaged_hits, 0u);
  EXPECT_EQ(rb.intact_misses, 0u);
  EXPECT_EQ(rb.misses, damaged.size());
  EXPECT_EQ(Crc(), damaged.size()) << torn_payload << " torn payloads, " << torn_header
                                   << " torn headers, " << misplaced << " misplaced";
}

// (f) Stand-in for read EIO: the data file is truncated under a running
// node, so every read of a demoted entry fails at the device (pread past
// the end of the file). Each is a miss (a failed promotion), never wrong
// bytes; the node stays up and keeps serving DRAM and taking new puts.
TEST_F(SsdCorruptionTest, TruncatedFileUnderRunningNodeIsMisses) {
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dir_, "16MiB", "64MiB", "1MiB", {"--ssd-buffers", "16"})));
  Workload cold{"f", 64 << 10, 256 << 10, 25};
  // One size class, so the newest filler keys are the ones DRAM keeps.
  Workload filler{"f-fill", 64 << 10, 64 << 10, 26};
  const uint64_t n = cold.KeysFor(16 * kMiB);
  ASSERT_EQ(PutRange(client_, cold, 0, n, 8, 8 * kMiB), 0u);
  const uint64_t nf = filler.KeysFor(32 * kMiB);
  ASSERT_EQ(PutRange(client_, filler, 0, nf, 8, 8 * kMiB), 0u);
  ASSERT_TRUE(Flush(client_));
  ASSERT_EQ(RecordsOf(cold, n).size(), n);

  ASSERT_EQ(::truncate(DataFile(dir_).c_str(), ssd::kSuperblockBytes), 0);
  const double f0 = M("kvpool_tier_promotion_failures_total");
  GetResult r = GetRange(client_, cold, 0, n);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
  EXPECT_EQ(M("kvpool_tier_promotion_failures_total") - f0, static_cast<double>(n));
  EXPECT_GT(M("kvpool_ssd_read_errors_total") + M("kvpool_ssd_crc_failures_total"), 0);

  int code = 0;
  node_->HttpGet("/healthz", &code);
  EXPECT_EQ(code, 200);
  // The newest filler keys are still in DRAM. (Each failed promotion
  // reserved a DRAM slot before its read failed, evicting an entry for
  // nothing, so only the newest few MiB are sure to be left.)
  const uint64_t tail = filler.KeysFor(2 * kMiB);
  GetResult recent = GetRange(client_, filler, nf - tail, nf);
  EXPECT_EQ(recent.hits, tail);
  EXPECT_EQ(recent.wrong, 0u);
  Workload fresh{"f-new", 4096, 64 << 10, 27};
  EXPECT_EQ(PutRange(client_, fresh, 0, 32), 0u);
  GetResult rf = GetRange(client_, fresh, 0, 32);
  EXPECT_EQ(rf.hits, 32u);
  EXPECT_EQ(rf.wrong, 0u);
}

// (f) A data file that cannot be opened at start (a directory in its
// place): the tier starts offline with the reason, and the node serves from
// DRAM (demotions are dropped and counted).
TEST_F(SsdCorruptionTest, UnopenableDataFileStartsOfflineAndServesDram) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(DataFile(dir_).c_str(), 0755), 0);
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dir_, "16MiB", "64MiB", "1MiB")));
  nlohmann::json s = SsdStatus(*node_);
  ASSERT_FALSE(s.is_null());
  EXPECT_EQ(s["recovery"].get<std::string>().rfind("cold", 0), 0u) << s["recovery"];
  ASSERT_EQ(s["dirs"].size(), 1u);
  EXPECT_EQ(s["dirs"][0]["online"], false);
  Workload w{"f2", 64 << 10, 64 << 10, 28};  // one size class: DRAM keeps the newest
  const uint64_t n = w.KeysFor(32 * kMiB);
  EXPECT_EQ(PutRange(client_, w, 0, n), 0u);
  EXPECT_GT(M("kvpool_tier_demotions_dropped_total"), 0);
  const uint64_t tail = w.KeysFor(8 * kMiB);
  GetResult r = GetRange(client_, w, n - tail, n);
  EXPECT_EQ(r.hits, tail);
  GetResult all = GetRange(client_, w, 0, n);
  EXPECT_EQ(all.wrong, 0u);
  EXPECT_EQ(all.errors, 0u);
  int code = 0;
  node_->HttpGet("/healthz", &code);
  EXPECT_EQ(code, 200);
}

}  // namespace
}  // namespace kvpool::testing
