// SSD-held entries in the cluster directory, against real kvpool-node
// processes and a real etcd: node A has a small DRAM tier over an SSD tier,
// so most of what it writes is held only on SSD. Those entries must reach
// their homes' directories like DRAM ones: when a joining node takes over
// shards (A replays the moved shards' SSD-only entries), and when A restarts
// (it publishes what its SSD tier recovered); and keys the SSD tier drops
// must leave them. Every read is compared byte for byte with what was put.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "harness/cluster_harness.h"
#include "ssd_test_util.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1 << 20;
// 320 values of 192 KiB = 60 MiB through A's 32 MiB DRAM tier.
constexpr uint64_t kN = 320;

class ClusterSsdTest : public EtcdClusterTest {
 protected:
  ClusterSsdTest() : EtcdClusterTest("ssd") {}
  void TearDown() override {
    for (kvpool_client* c : clients_) kvpool_close(c);
    if (!HasFailure()) return;
    for (NodeProcess* n : {a_.get(), b_.get(), c_.get()}) {
      if (n == nullptr) continue;
      std::string log = n->Log();
      if (log.size() > 4000) log = log.substr(log.size() - 4000);
      std::cerr << "---- node log (tail) ----\n" << log << "\n";
    }
  }

  // dir empty: ssd_dir_.
  std::vector<std::string> SsdNodeArgs(const std::string& id, const std::string& dir = "") const {
    auto args = Args(id);
    auto ssd = SsdArgs(dir.empty() ? ssd_dir_ : dir, "32MiB", ssd_capacity_, "1MiB",
                       {"--ssd-buffers", "8"});
    args.insert(args.end(), ssd.begin(), ssd.end());
    return args;
  }
  kvpool_client* Client(const NodeProcess& n) {
    kvpool_client* c = OpenClient(n.socket());
    EXPECT_NE(c, nullptr) << NodeDiagnosis(n);
    if (c != nullptr) clients_.push_back(c);
    return c;
  }
  // How many of keys [0, kN) the node finds (locally or in a directory).
  uint64_t Found(kvpool_client* c) {
    uint64_t found = 0;
    for (uint64_t lo = 0; lo < kN; lo += 64) {
      std::vector<kvpool_key_id> ids;
      for (uint64_t i = lo; i < std::min(kN, lo + 64); ++i) ids.push_back(w_.Id(i));
      std::vector<uint8_t> hits(ids.size());
      size_t prefix = 0;
      if (kvpool_exists(c, ids.data(), ids.size(), hits.data(), &prefix) != KVPOOL_OK) return 0;
      for (uint8_t h : hits) found += h;
    }
    return found;
  }
  bool AllSee(std::initializer_list<NodeProcess*> nodes, size_t members) {
    for (NodeProcess* n : nodes) {
      if (Members(*n).size() != members) return false;
    }
    return true;
  }
  // Starts A (SSD tier of ssd_capacity_) and B; A writes every key
  // (flushed: demotions never find the buffers busy), most of them end up
  // on SSD. Nothing is read, so nothing is promoted: DRAM and SSD hold
  // disjoint sets of keys. *ca, *cb: clients of A and B.
  void StartAAndBThenWrite(kvpool_client** ca_out, kvpool_client** cb_out) {
    a_ = StartNodeWith(SsdNodeArgs("a"));
    b_ = StartNodeWith(Args("b"));
    ASSERT_TRUE(a_ && b_);
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return AllSee({a_.get(), b_.get()}, 2); }));
    kvpool_client* ca = *ca_out = Client(*a_);
    kvpool_client* cb = *cb_out = Client(*b_);
    ASSERT_TRUE(ca && cb);
    ASSERT_EQ(PutRange(ca, w_, 0, kN, 8, 8 * kMiB), 0u);
    ASSERT_TRUE(Flush(ca));
    EXPECT_LT(DramEntries(*a_), kN / 2);
    EXPECT_EQ(MetricOr0(*a_, "kvpool_tier_demotions_dropped_total"), 0);
  }
  // Keys A holds: in DRAM or on SSD (disjoint, see above).
  uint64_t HeldByA() { return DramEntries(*a_) + SsdStatus(*a_)["entries"].get<uint64_t>(); }
  // A holds every key, and B's directory lookups find all.
  void ExpectAllFound(kvpool_client* cb) {
    EXPECT_EQ(HeldByA(), kN);
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Found(cb) == kN; }))
        << "B finds " << Found(cb) << " of " << kN;
  }

  TempDir tmp_;
  std::string ssd_dir_ = tmp_.path() + "/ssd";
  std::string ssd_capacity_ = "256MiB";
  Workload w_{"cluster-ssd", 192 << 10, 192 << 10, 5};
  std::unique_ptr<NodeProcess> a_, b_, c_;
  std::vector<kvpool_client*> clients_;
};

// C joins: the shards it takes over include keys that A holds only on SSD.
// A replays them to C (the DRAM inventory alone would leave them unknown
// there), so every key reads back through C, byte-exact.
TEST_F(ClusterSsdTest, JoiningNodeLearnsSsdOnlyEntriesOfMovedShards) {
  kvpool_client *ca = nullptr, *cb = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartAAndBThenWrite(&ca, &cb));
  ASSERT_NO_FATAL_FAILURE(ExpectAllFound(cb));

  c_ = StartNodeWith(Args("c"));
  ASSERT_NE(c_, nullptr);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return AllSee({a_.get(), b_.get(), c_.get()}, 3);
  }));
  kvpool_client* cc = Client(*c_);
  ASSERT_NE(cc, nullptr);
  EXPECT_TRUE(WaitFor(milliseconds(10000), [&] { return Found(cc) == kN; }))
      << "C finds " << Found(cc) << " of " << kN;
  EXPECT_GT(MetricOr0(*c_, "kvpool_directory_entries"), 0);
  GetResult r = GetRange(cc, w_, 0, kN);
  EXPECT_EQ(r.hits, kN);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
  // A republished SSD-only entries of the moved shards, read from their
  // record headers.
  EXPECT_GT(MetricOr0(*a_, "kvpool_publish_ssd_replayed_total"), 0);
  EXPECT_GT(MetricOr0(*a_, "kvpool_ssd_list_entries_total"), 0);
}

// A stops cleanly (its DRAM goes to SSD, a checkpoint is written) and its
// entries leave B's directory with it; restarted, A publishes everything
// its SSD tier recovered, and every key reads back through B, byte-exact.
TEST_F(ClusterSsdTest, RestartedNodePublishesWhatItsSsdRecovered) {
  kvpool_client *ca = nullptr, *cb = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartAAndBThenWrite(&ca, &cb));
  ASSERT_NO_FATAL_FAILURE(ExpectAllFound(cb));

  kvpool_close(ca);
  clients_.erase(clients_.begin());
  a_->Stop(SIGTERM);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*b_).count("a") == 0; }));
  EXPECT_TRUE(WaitFor(milliseconds(3000), [&] { return Found(cb) == 0; }))
      << "B still finds " << Found(cb) << " keys of the stopped node";

  a_ = StartNodeWith(SsdNodeArgs("a"));
  ASSERT_NE(a_, nullptr);
  nlohmann::json s = SsdStatus(*a_);
  EXPECT_EQ(s["recovery"], "checkpoint");
  EXPECT_EQ(s["entries"].get<uint64_t>(), kN);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return AllSee({a_.get(), b_.get()}, 2); }));
  EXPECT_TRUE(WaitFor(milliseconds(10000), [&] { return Found(cb) == kN; }))
      << "B finds " << Found(cb) << " of " << kN;
  GetResult r = GetRange(cb, w_, 0, kN);
  EXPECT_EQ(r.hits, kN);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.errors, 0u);
  EXPECT_GE(MetricOr0(*a_, "kvpool_publish_ssd_replayed_total"), static_cast<double>(kN));
}

// A's SSD tier is too small for what DRAM evicts to it: reclaimed regions
// drop keys, and A unpublishes them (unless DRAM holds them), so B's
// lookups find exactly the keys A still holds -- not ones a fetch would
// then miss.
TEST_F(ClusterSsdTest, KeysTheSsdTierDroppedAreUnpublished) {
  ssd_capacity_ = "16MiB";  // 15 regions of 1 MiB: about 75 values
  kvpool_client *ca = nullptr, *cb = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartAAndBThenWrite(&ca, &cb));
  const uint64_t held = HeldByA();
  EXPECT_LT(held, kN - 100);
  EXPECT_GT(MetricOr0(*a_, "kvpool_ssd_region_evictions_total"), 0);
  EXPECT_TRUE(WaitFor(milliseconds(5000), [&] { return Found(cb) == held; }))
      << "B finds " << Found(cb) << " of the " << held << " keys A holds";
  EXPECT_EQ(MetricOr0(*a_, "kvpool_publish_ssd_dropped_total"), static_cast<double>(kN - held));
}

// A rolling restart (RELIABILITY B8, scaled down): three nodes with SSD
// tiers each write a third of the keys, then are restarted in turn
// (SIGTERM, started again on the same directory, until all three see each
// other) while a reader reads every key through a node that is up. No read
// returns a wrong byte or takes 3 s; after the last restart every node
// finds and reads every key, byte-exact.
TEST_F(ClusterSsdTest, RollingRestartKeepsEveryKeyReadable) {
  std::unique_ptr<NodeProcess>* nodes[3] = {&a_, &b_, &c_};
  const std::string ids[3] = {"a", "b", "c"};
  std::string dirs[3];
  for (int i = 0; i < 3; ++i) {
    dirs[i] = tmp_.path() + "/ssd-" + ids[i];
    *nodes[i] = StartNodeWith(SsdNodeArgs(ids[i], dirs[i]));
    ASSERT_NE(*nodes[i], nullptr);
  }
  auto all_see_three = [&] { return AllSee({a_.get(), b_.get(), c_.get()}, 3); };
  ASSERT_TRUE(WaitFor(milliseconds(5000), all_see_three));
  std::atomic<kvpool_client*> clients[3];
  for (int i = 0; i < 3; ++i) {
    clients[i] = OpenClient((*nodes[i])->socket());
    ASSERT_NE(clients[i].load(), nullptr);
    ASSERT_EQ(PutRange(clients[i], w_, i * kN / 3, (i + 1) * kN / 3, 8, 8 * kMiB), 0u);
    ASSERT_TRUE(Flush(clients[i]));
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Found(clients[i]) == kN; }))
        << ids[i] << " finds " << Found(clients[i]);
  }

  // The reader uses a node that is not being restarted.
  std::atomic<int> restarting{-1};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hits{0}, misses{0}, wrong{0}, slow{0};
  std::mutex client_mu;  // a client is not closed while the reader uses it
  std::thread reader;
  // Joined however the test leaves (an ASSERT returns early).
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{stop, reader};
  reader = std::thread([&] {
    uint64_t next = 0;
    for (int round = 0; !stop; ++round) {
      int n = (restarting.load() + 1 + round % 2) % 3;
      if (n == restarting.load()) continue;
      std::vector<uint64_t> idx;
      for (int k = 0; k < 8; ++k) idx.push_back(next++ % kN);
      std::lock_guard lock(client_mu);
      if (clients[n] == nullptr) continue;
      auto t0 = std::chrono::steady_clock::now();
      GetResult r = GetIndices(clients[n], w_, idx);
      if (std::chrono::steady_clock::now() - t0 > milliseconds(3000)) ++slow;
      hits += r.hits;
      misses += r.misses + r.errors;
      wrong += r.wrong;
    }
  });
  for (int i = 0; i < 3; ++i) {
    restarting = i;
    {
      std::lock_guard lock(client_mu);
      kvpool_close(clients[i]);
      clients[i] = nullptr;
    }
    EXPECT_EQ((*nodes[i])->Stop(SIGTERM), 0) << ids[i];
    *nodes[i] = StartNodeWith(SsdNodeArgs(ids[i], dirs[i]));
    ASSERT_NE(*nodes[i], nullptr);
    // Its own third at least (plus replicas the reader's remote reads left).
    EXPECT_GE(SsdStatus(**nodes[i])["entries"].get<uint64_t>(), (i + 1) * kN / 3 - i * kN / 3)
        << ids[i] << " after its restart";
    {
      std::lock_guard lock(client_mu);
      clients[i] = OpenClient((*nodes[i])->socket());
    }
    ASSERT_NE(clients[i].load(), nullptr);
    EXPECT_TRUE(WaitFor(milliseconds(10000), all_see_three)) << ids[i] << " did not rejoin";
  }
  restarting = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(WaitFor(milliseconds(30000), [&] { return Found(clients[i]) == kN; }))
        << ids[i] << " finds " << Found(clients[i]) << " of " << kN;
  }
  stop = true;
  reader.join();
  for (int i = 0; i < 3; ++i) {
    GetResult r = GetRange(clients[i], w_, 0, kN);
    EXPECT_EQ(r.hits, kN) << ids[i];
    EXPECT_EQ(r.wrong, 0u) << ids[i];
    EXPECT_EQ(r.errors, 0u) << ids[i];
    kvpool_close(clients[i]);
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(slow, 0u);
  EXPECT_GT(hits, 0u);
  std::printf("SUMMARY {\"test\":\"rolling_restart\",\"keys\":%llu,\"reads_hit\":%llu,"
              "\"reads_missed\":%llu,\"wrong\":%llu,\"over_3s\":%llu}\n",
              (unsigned long long)kN, (unsigned long long)hits.load(),
              (unsigned long long)misses.load(), (unsigned long long)wrong.load(),
              (unsigned long long)slow.load());
}

}  // namespace
}  // namespace kvpool::testing
