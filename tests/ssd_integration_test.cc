// SSD tier, end to end, against the real kvpool-node (--ssd): more data than
// DRAM holds reads back byte-exact through demotion and promotion; clean and
// crash restarts keep exactly what they can prove; a full disk and an
// incompatible restart degrade without wrong bytes or a crash.
//
// Every get is compared byte for byte with the value that was put
// (Pattern()); "wrong" counts any hit whose size or bytes differ. The SSD
// directories are ordinary directories under /tmp (O_DIRECT where the
// filesystem allows it; the engine falls back to buffered I/O on tmpfs).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "ssd_test_util.h"

namespace kvpool::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class SsdNodeTest : public ::testing::Test {
 protected:
  std::unique_ptr<NodeProcess> StartNode(const std::vector<std::string>& args) {
    std::string log;
    auto n = NodeProcess::Start(args, "", &log);
    EXPECT_NE(n, nullptr) << "node did not start:\n" << log;
    return n;
  }
  void TearDown() override {
    if (HasFailure() && node_ != nullptr) {
      std::string log = node_->Log();
      if (log.size() > 6000) log = log.substr(log.size() - 6000);
      std::cerr << "---- node log (tail) ----\n" << log << "\n";
    }
  }
  // Closes the client and stops the node with sig; returns the wait status.
  int StopNode(int sig) {
    if (client_ != nullptr) kvpool_close(client_);
    client_ = nullptr;
    int st = node_->Stop(sig);
    return st;
  }
  void Restart(const std::vector<std::string>& args) {
    node_ = StartNode(args);
    ASSERT_NE(node_, nullptr);
    client_ = OpenClient(node_->socket());
    ASSERT_NE(client_, nullptr) << NodeDiagnosis(*node_);
  }
  ~SsdNodeTest() override {
    if (client_ != nullptr) kvpool_close(client_);
  }
  uint64_t MaxValue() { return kvpool_max_value_size(client_); }
  // Puts keys [0, n) of w (a flush barrier every 8 MiB), flushes; returns
  // the SSD tier's entries then.
  uint64_t PutAllAndFlush(const Workload& w, uint64_t n) {
    EXPECT_EQ(PutRange(client_, w, 0, n, 8, 8 * kMiB), 0u);
    EXPECT_TRUE(Flush(client_));
    return SsdStatus(*node_)["entries"].get<uint64_t>();
  }
  // Restarts with args: the tier must recover by `recovery` with exactly
  // `entries`, and reading keys [0, n) of w hits exactly those, byte-exact.
  GetResult RestartExpect(const std::vector<std::string>& args, const std::string& recovery,
                          const Workload& w, uint64_t n, uint64_t entries) {
    Restart(args);
    if (node_ == nullptr || client_ == nullptr) return {};
    nlohmann::json s = SsdStatus(*node_);
    EXPECT_EQ(s["recovery"], recovery);
    EXPECT_EQ(s["entries"].get<uint64_t>(), entries);
    GetResult r = GetRange(client_, w, 0, n);
    EXPECT_EQ(r.wrong, 0u);
    EXPECT_EQ(r.errors, 0u);
    EXPECT_EQ(r.hits, entries);
    return r;
  }
  double M(const std::string& s) { return MetricOr0(*node_, s); }
  // Puts keys of a, flushes, puts keys of b, checks that the demotions took
  // the in-place path `mode` (lent slots), and kills the node with SIGKILL.
  struct KillPoint {
    uint64_t na = 0, nb = 0;
    uint64_t flushed = 0;      // SSD entries at the flush
    uint64_t before_kill = 0;  // SSD entries just before the kill
  };
  // The node's segment is on hugetlb pages (its status says so).
  void ExpectHugePageSegment() {
    int code = 0;
    auto status = nlohmann::json::parse(node_->HttpGet("/api/v1/status", &code));
    ASSERT_EQ(code, 200);
    ASSERT_TRUE(status["dram"]["huge_pages"].get<bool>()) << "the segment is not on huge pages";
  }
  KillPoint PutFlushPutKill(const Workload& a, const Workload& b, const std::string& mode) {
    KillPoint k;
    k.na = a.KeysFor(64 * kMiB);
    k.nb = b.KeysFor(64 * kMiB);
    EXPECT_EQ(PutRange(client_, a, 0, k.na), 0u);
    EXPECT_TRUE(Flush(client_));
    k.flushed = SsdStatus(*node_)["entries"].get<uint64_t>();
    EXPECT_EQ(PutRange(client_, b, 0, k.nb), 0u);
    k.before_kill = SsdStatus(*node_)["entries"].get<uint64_t>();
    EXPECT_GT(M("kvpool_ssd_lent_records_total{mode=\"" + mode + "\"}"), 0) << mode;
    StopNode(SIGKILL);
    return k;
  }
  // Restarts after PutFlushPutKill: the tier recovers by scan with at least
  // what was flushed and at most what was there; every indexed entry reads
  // back exact and nothing else does. Returns the entries recovered.
  uint64_t RestartAfterKill(const std::vector<std::string>& args, const Workload& a,
                            const Workload& b, const KillPoint& k) {
    Restart(args);
    if (node_ == nullptr || client_ == nullptr) return 0;
    nlohmann::json s = SsdStatus(*node_);
    EXPECT_EQ(s["recovery"], "scan");
    const uint64_t recovered = s["entries"].get<uint64_t>();
    EXPECT_GE(recovered, k.flushed);
    EXPECT_LE(recovered, k.before_kill);
    GetResult ra = GetRange(client_, a, 0, k.na);
    GetResult rb = GetRange(client_, b, 0, k.nb);
    EXPECT_EQ(ra.wrong + rb.wrong, 0u);
    EXPECT_EQ(ra.errors + rb.errors, 0u);
    EXPECT_GE(ra.hits, k.flushed);
    EXPECT_EQ(ra.hits + rb.hits, recovered) << "indexed entries that did not read back";
    EXPECT_EQ(SsdStatus(*node_)["crc_failures"], 0);
    return recovered;
  }

  TempDir tmp_;
  std::string dir_ = tmp_.path() + "/ssd";
  std::unique_ptr<NodeProcess> node_;
  kvpool_client* client_ = nullptr;
};

// (a) ~150 MiB through a 32 MiB DRAM tier over two SSD directories: every
// key hits with its exact bytes, most of them promoted from SSD, nothing
// dropped or corrupt on the way.
TEST_F(SsdNodeTest, MoreThanDramReadsBackByteExact) {
  const std::string dirs = tmp_.path() + "/ssd0," + tmp_.path() + "/ssd1";
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dirs, "32MiB", "256MiB", "4MiB")));
  Workload w{"a", 64 << 10, std::min<uint64_t>(kMiB, MaxValue()), 11};
  const uint64_t n = w.KeysFor(150 * kMiB);
  // Paced: 16 MiB between barriers < the 2 x 4 region buffers of 4 MiB.
  ASSERT_EQ(PutRange(client_, w, 0, n, 8, 16 * kMiB), 0u);
  GetResult r = GetRange(client_, w, 0, n);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
  EXPECT_EQ(r.hits, n) << "misses " << r.misses << " (demotions dropped: "
                       << M("kvpool_tier_demotions_dropped_total") << ")";
  // DRAM holds at most 32 of the 150 MiB: well over half the reads came from SSD.
  const double promotions = M("kvpool_tier_promotions_total");
  EXPECT_GT(promotions, n / 2.0);
  EXPECT_EQ(M("kvpool_tier_promotion_failures_total"), 0);
  EXPECT_EQ(M("kvpool_tier_demotions_dropped_total"), 0);
  EXPECT_GT(M("kvpool_tier_demotions_total"), 0);
  nlohmann::json s = SsdStatus(*node_);
  ASSERT_FALSE(s.is_null());
  EXPECT_EQ(s["crc_failures"], 0);
  EXPECT_EQ(s["inserts_dropped"], 0);
  EXPECT_EQ(s["region_evictions"], 0);
  EXPECT_EQ(s["dirs"].size(), 2u);
  EXPECT_GT(s["dirs"][0]["writes"].get<uint64_t>(), 0u);  // both directories took writes
  EXPECT_GT(s["dirs"][1]["writes"].get<uint64_t>(), 0u);
  EXPECT_GE(s["reads"].get<double>(), promotions);
  EXPECT_LE(s["index_bytes_per_entry"].get<double>(), 32.0);
}

// (b) A clean stop (SIGTERM) writes the DRAM tier's entries to SSD, flushes
// and checkpoints; the restarted node loads the checkpoint and every key
// written before is a hit, byte-exact — the ones that were on SSD and the
// ones that were only in DRAM at the stop.
TEST_F(SsdNodeTest, CleanRestartLoadsCheckpointAndKeepsEveryKey) {
  const auto args = SsdArgs(dir_, "32MiB", "256MiB", "1MiB", {"--ssd-buffers", "16"});
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload w{"b", 64 << 10, std::min<uint64_t>(512 << 10, MaxValue()), 12};
  const uint64_t n = w.KeysFor(96 * kMiB);
  ASSERT_EQ(PutRange(client_, w, 0, n, 8, 8 * kMiB), 0u);
  ASSERT_EQ(M("kvpool_tier_demotions_dropped_total"), 0);
  const uint64_t on_ssd = SsdStatus(*node_)["entries"].get<uint64_t>();
  const uint64_t in_dram =
      nlohmann::json::parse(node_->HttpGet("/api/v1/status"))["dram"]["entries"].get<uint64_t>();
  EXPECT_EQ(on_ssd + in_dram, n) << "every key is in exactly one tier (nothing read yet)";
  EXPECT_GT(in_dram, 0u) << "the test must cover DRAM-only keys";
  int st = StopNode(SIGTERM);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;

  // Every key (DRAM ones included) across a clean restart.
  ASSERT_NO_FATAL_FAILURE(RestartExpect(args, "checkpoint", w, n, n));
  EXPECT_EQ(SsdStatus(*node_)["crc_failures"], 0);
}

// With --no-ssd-persist-on-stop the stop only flushes and checkpoints what
// was already on SSD: exactly the DRAM-only entries are lost.
TEST_F(SsdNodeTest, CleanRestartWithoutPersistKeepsOnlySsdEntries) {
  const auto args = SsdArgs(dir_, "32MiB", "256MiB", "1MiB",
                            {"--ssd-buffers", "16", "--no-ssd-persist-on-stop"});
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload w{"b2", 64 << 10, std::min<uint64_t>(512 << 10, MaxValue()), 12};
  const uint64_t n = w.KeysFor(96 * kMiB);
  ASSERT_EQ(PutRange(client_, w, 0, n, 8, 8 * kMiB), 0u);
  const uint64_t on_ssd = SsdStatus(*node_)["entries"].get<uint64_t>();
  int st = StopNode(SIGTERM);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  EXPECT_EQ(SsdStatus(*node_)["recovery"], "checkpoint");
  GetResult r = GetRange(client_, w, 0, n);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.hits, on_ssd);
}

// A batch get of keys that are only on SSD hits every one of them: the
// promotions of one call must not evict each other from a small DRAM tier
// before the call is answered (they stay pinned until then). Regression
// test: before the pins, 8 keys per call over 293 values of 64 KiB-1 MiB in
// a 32 MiB DRAM tier gave 74 misses with 293 successful promotions.
TEST_F(SsdNodeTest, BatchGetOfColdKeysHitsEveryKey) {
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dir_, "32MiB", "256MiB", "4MiB", {"--ssd-buffers", "8"})));
  Workload w{"a8", 64 << 10, std::min<uint64_t>(kMiB, MaxValue()), 11};
  const uint64_t n = w.KeysFor(150 * kMiB);
  ASSERT_EQ(PutRange(client_, w, 0, n, 8, 16 * kMiB), 0u);
  GetResult r = GetRange(client_, w, 0, n, 16);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
  EXPECT_EQ(r.hits, n) << "misses " << r.misses << "; promotions "
                       << M("kvpool_tier_promotions_total") << ", failed "
                       << M("kvpool_tier_promotion_failures_total");
}

// (c1) Crash right after the durability barrier: the region scan rebuilds
// exactly the entries that were on SSD at the flush (none were read or
// promoted in between), all byte-exact; the DRAM-only ones are gone.
TEST_F(SsdNodeTest, CrashAfterFlushKeepsExactlyTheFlushedEntries) {
  const auto args = SsdArgs(dir_, "32MiB", "256MiB", "1MiB", {"--ssd-buffers", "16"});
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload w{"c1", 64 << 10, std::min<uint64_t>(512 << 10, MaxValue()), 13};
  const uint64_t n = w.KeysFor(96 * kMiB);
  const uint64_t flushed = PutAllAndFlush(w, n);
  ASSERT_GT(flushed, n / 2);
  StopNode(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(RestartExpect(args, "scan", w, n, flushed));
  EXPECT_EQ(SsdStatus(*node_)["crc_failures"], 0);
}

// Removes are logged: keys removed (mostly from SSD) and flushed before a
// crash stay removed after the scan restart; every other key still hits
// byte-exact.
TEST_F(SsdNodeTest, RemovedKeysStayRemovedAfterCrash) {
  const auto args = SsdArgs(dir_, "32MiB", "256MiB", "1MiB", {"--ssd-buffers", "16"});
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload w{"rm", 64 << 10, std::min<uint64_t>(256 << 10, MaxValue()), 21};
  const uint64_t n = w.KeysFor(96 * kMiB);
  const uint64_t flushed = PutAllAndFlush(w, n);
  std::vector<kvpool_key_id> ids;
  for (uint64_t i = 0; i < n; i += 4) ids.push_back(w.Id(i));
  std::vector<kvpool_status> st(ids.size());
  ASSERT_EQ(kvpool_remove(client_, ids.data(), ids.size(), st.data()), KVPOOL_OK);
  for (size_t i = 0; i < st.size(); ++i) ASSERT_EQ(st[i], KVPOOL_OK) << i;
  ASSERT_TRUE(Flush(client_));
  const uint64_t kept = SsdStatus(*node_)["entries"].get<uint64_t>();
  ASSERT_GT(flushed - kept, n / 8);  // most removed keys were on SSD
  StopNode(SIGKILL);
  GetResult r;
  ASSERT_NO_FATAL_FAILURE(r = RestartExpect(args, "scan", w, n, kept));
  ASSERT_EQ(r.hit.size(), n);
  for (uint64_t i = 0; i < n; i += 4) EXPECT_EQ(r.hit[i], 0) << i;
}

// (c2) Crash while demotions after the barrier are still being written:
// what was flushed survives, every key that comes back is byte-exact, every
// entry the scan indexes reads back (no torn record is served), and the log
// has no holes: the regions found in the file after the crash carry the
// sequence numbers 1..max without a gap (no older region lost while a newer
// one survived; nothing is reclaimed at this capacity).
TEST_F(SsdNodeTest, CrashDuringDemotionsLosesOnlyTheUnwrittenTail) {
  const auto args = SsdArgs(dir_, "32MiB", "256MiB", "1MiB");
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  Workload a{"c2a", 64 << 10, std::min<uint64_t>(256 << 10, MaxValue()), 14};
  Workload b{"c2b", 64 << 10, std::min<uint64_t>(256 << 10, MaxValue()), 15};
  // The demotions take the in-place path (slots lent, copied by the flush
  // threads), the one this crash interrupts.
  const KillPoint k = PutFlushPutKill(a, b, "copy");
  ASSERT_FALSE(HasFatalFailure());

  std::vector<RecordLoc> recs = ParseRecords(DataFile(dir_));
  std::set<uint64_t> seqs;
  for (const auto& r : recs) seqs.insert(r.region_seq);
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(*seqs.begin(), 1u);
  EXPECT_EQ(*seqs.rbegin(), seqs.size()) << "region sequence has holes: " << seqs.size()
                                         << " regions, highest seq " << *seqs.rbegin();

  EXPECT_EQ(RestartAfterKill(args, a, b, k), recs.size());
}

// (g') With the segment on huge pages, demotions of values of 256 KiB and
// more go to SSD in gather mode: the region write takes their bytes from
// the DRAM slots, which stay held until it is done. A kill -9 under that
// load keeps what was flushed and loses only the unwritten tail; no get
// returns a wrong byte.
TEST_F(SsdNodeTest, HugePageSegmentGathersDemotionsAndAKillLosesOnlyTheUnwrittenTail) {
  // 32 MiB of DRAM and its 4 MiB read room are 18 pages of 2 MiB.
  HugePageReserve pages(24);
  if (!pages.ok()) GTEST_SKIP() << "no huge pages for the segment: " << pages.why();
  const auto args = SsdArgs(dir_, "32MiB", "256MiB", "4MiB", {"--huge-pages"});
  ASSERT_NO_FATAL_FAILURE(Restart(args));
  ASSERT_NO_FATAL_FAILURE(ExpectHugePageSegment());
  const uint64_t top = std::min<uint64_t>(1 << 20, MaxValue());
  Workload a{"g2a", 256 << 10, top, 31};
  Workload b{"g2b", 256 << 10, top, 32};
  const KillPoint k = PutFlushPutKill(a, b, "gather");
  ASSERT_FALSE(HasFatalFailure());
  RestartAfterKill(args, a, b, k);
}

// (g'') On huge pages, gathered slots stay lent until their region is
// written, so they may take only half of what is lent at once (1 of the
// 2 MiB this node lends); past that, demotions are lent for a flush
// thread's copy, which gives the slot back at once.
TEST_F(SsdNodeTest, HugePageSegmentLendsPastTheGatherLimitForACopy) {
  HugePageReserve pages(24);
  if (!pages.ok()) GTEST_SKIP() << "no huge pages for the segment: " << pages.why();
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dir_, "32MiB", "256MiB", "4MiB", {"--huge-pages"})));
  ASSERT_NO_FATAL_FAILURE(ExpectHugePageSegment());
  Workload w{"g3", 256 << 10, std::min<uint64_t>(kMiB, MaxValue()), 33};
  const uint64_t n = w.KeysFor(64 * kMiB);
  EXPECT_EQ(PutRange(client_, w, 0, n), 0u);
  EXPECT_GT(M("kvpool_ssd_lent_records_total{mode=\"gather\"}"), 0);
  EXPECT_GT(M("kvpool_ssd_lent_records_total{mode=\"copy\"}"), 0);
  GetResult r = GetRange(client_, w, 0, n);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
}

// (g) The SSD file lives on a 64 MiB tmpfs but claims 256 MiB: once the
// disk is full, demotions are dropped (counted), puts keep succeeding into
// DRAM, the node stays up and no get returns wrong bytes.
TEST_F(SsdNodeTest, DiskFullDropsDemotionsAndKeepsServing) {
  std::string why;
  std::string mp = tmp_.MountTmpfs("64m", &why);
  if (mp.empty()) GTEST_SKIP() << "needs a tmpfs mount: " << why;
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(mp, "32MiB", "256MiB", "1MiB")));
  Workload w{"g", 64 << 10, std::min<uint64_t>(256 << 10, MaxValue()), 16};
  const uint64_t n = w.KeysFor(160 * kMiB);
  EXPECT_EQ(PutRange(client_, w, 0, n), 0u) << "puts must succeed into DRAM";
  const double dropped = M("kvpool_tier_demotions_dropped_total");
  EXPECT_GT(dropped, 0);
  nlohmann::json s = SsdStatus(*node_);
  ASSERT_FALSE(s.is_null()) << "node stopped answering";
  EXPECT_GT(s["inserts_dropped"].get<uint64_t>(), 0u);
  EXPECT_LE(s["write_bytes"].get<uint64_t>(), 64 * kMiB);
  // The newest keys are in DRAM; older ones are on SSD or gone.
  const uint64_t tail = w.KeysFor(8 * kMiB);
  GetResult recent = GetRange(client_, w, n - tail, n);
  EXPECT_EQ(recent.hits, tail);
  EXPECT_EQ(recent.wrong, 0u);
  GetResult all = GetRange(client_, w, 0, n);
  EXPECT_EQ(all.wrong, 0u);
  EXPECT_EQ(all.errors, 0u);
  EXPECT_GT(all.hits, tail);  // what fit on the tmpfs still serves
  // And the node still takes new work.
  // On a miss the message says what moved in DRAM between the put and the
  // get (this line missed 4 of 16 once in a full run, not reproduced).
  Workload w2{"g2", 4096, 4096, 17};
  const double evicted0 = M("kvpool_dram_evictions_total");
  const double moves0 = M("kvpool_dram_slab_moves_total");
  const double promoted0 = M("kvpool_tier_promotions_total");
  EXPECT_EQ(PutRange(client_, w2, 0, 16), 0u);
  const double evicted1 = M("kvpool_dram_evictions_total");
  GetResult fresh = GetRange(client_, w2, 0, 16);
  EXPECT_EQ(fresh.hits, 16u) << "evictions during the puts " << evicted1 - evicted0
                             << ", after them " << M("kvpool_dram_evictions_total") - evicted1
                             << "; slab moves " << M("kvpool_dram_slab_moves_total") - moves0
                             << "; promotions " << M("kvpool_tier_promotions_total") - promoted0;
  int code = 0;
  node_->HttpGet("/healthz", &code);
  EXPECT_EQ(code, 200);
}

// (h) A restart with another geometry (region size, then capacity) must not
// trust the old file: it starts cold with the reason, serves none of the old
// records, and works normally.
TEST_F(SsdNodeTest, IncompatibleRestartStartsCold) {
  const std::vector<std::string> buffers = {"--ssd-buffers", "8"};
  ASSERT_NO_FATAL_FAILURE(Restart(SsdArgs(dir_, "16MiB", "128MiB", "1MiB", buffers)));
  Workload w{"h", 64 << 10, 256 << 10, 18};
  const uint64_t n = w.KeysFor(40 * kMiB);
  ASSERT_EQ(PutRange(client_, w, 0, n, 8, 4 * kMiB), 0u);
  ASSERT_GT(SsdStatus(*node_)["entries"].get<uint64_t>(), 0u);
  int st = StopNode(SIGTERM);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);

  // Every key written under an earlier geometry must miss after the change.
  std::vector<std::pair<Workload, uint64_t>> old = {{w, n}};
  int round = 0;
  for (const auto& args : {SsdArgs(dir_, "16MiB", "128MiB", "2MiB", buffers),    // region size
                           SsdArgs(dir_, "16MiB", "160MiB", "2MiB", buffers)}) {  // capacity
    ASSERT_NO_FATAL_FAILURE(Restart(args));
    nlohmann::json s = SsdStatus(*node_);
    ASSERT_FALSE(s.is_null());
    EXPECT_EQ(s["recovery"].get<std::string>().rfind("cold", 0), 0u) << s["recovery"];
    EXPECT_NE(s["recovery"].get<std::string>().find("geometry"), std::string::npos) << s["recovery"];
    EXPECT_EQ(s["entries"], 0);
    for (const auto& [ow, on] : old) {
      GetResult r = GetRange(client_, ow, 0, on);
      EXPECT_EQ(r.hits, 0u) << ow.ns;
      EXPECT_EQ(r.wrong, 0u);
      EXPECT_EQ(r.errors, 0u);
    }
    // Works normally afterwards: write past DRAM, read back.
    Workload w2{"h2-" + std::to_string(round++), 64 << 10, 256 << 10, 19};
    const uint64_t n2 = w2.KeysFor(40 * kMiB);
    ASSERT_EQ(PutRange(client_, w2, 0, n2, 8, 8 * kMiB), 0u);
    GetResult r2 = GetRange(client_, w2, 0, n2);
    EXPECT_EQ(r2.hits, n2);
    EXPECT_EQ(r2.wrong, 0u);
    old.push_back({w2, n2});
    st = StopNode(SIGTERM);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
}

}  // namespace
}  // namespace kvpool::testing
