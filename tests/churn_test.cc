// Churn: one node of three is killed (SIGKILL) and started again at once,
// with the same id and the same peer port, 15 times under a byte-verified
// read/write load on the other two; in etcd mode and in static --peers mode.
// Every restart must serve again (locally, to its peers and through them)
// within the lease TTL plus 2 s, with no wrong byte and no operation over 3 s.
// Each test prints one summary line ("SUMMARY {...}").
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "harness/cluster_harness.h"
#include "harness/load.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kRounds = 15;
constexpr milliseconds kLeaseTtl{2000};

struct ChurnResult {
  std::vector<int64_t> serve_ms;  // per round: kill to serving again
  uint64_t wrong = 0;
  uint64_t over_3s = 0;
};

// Runs the rounds: nodes[0..1] carry the load, nodes[2] is the victim,
// restarted by start(). Serving again means: the new victim takes a put and
// reads it back, a value put on it reads through node 0, and a value of
// node 0 reads through it; plus `joined` (its view in the cluster).
ChurnResult Churn(std::vector<std::unique_ptr<NodeProcess>>& nodes,
                  const std::function<std::unique_ptr<NodeProcess>()>& start,
                  const std::function<bool()>& joined) {
  ChurnResult r;
  Registry reg;
  LoadStats s;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads = StartLoad(nodes, {0, 1}, 2, &reg, &s, &stop, 600);
  Conn a(*nodes[0]);
  EXPECT_TRUE(a.ok());
  auto of_a = MakeKeys("churn-a-", 0, 16, 77000, 2048, 4096);
  EXPECT_EQ(a.Put(of_a), of_a.size());
  // The puts published before the churn: found through the other nodes.
  {
    Conn b(*nodes[1]), c(*nodes[2]);
    EXPECT_TRUE(WaitFor(milliseconds(5000), [&] {
      return b.ExistsCount(of_a) == of_a.size() && c.ExistsCount(of_a) == of_a.size();
    }));
  }
  for (int round = 0; round < kRounds; ++round) {
    nodes[2]->Stop(SIGKILL);
    auto killed = steady_clock::now();
    nodes[2] = start();
    if (nodes[2] == nullptr) {
      ADD_FAILURE() << "round " << round << ": the victim did not start";
      break;
    }
    auto mine = MakeKeys("churn-v" + std::to_string(round) + "-", 2, 8, 5000000 + round * 100,
                         1024, 2048);
    Conn v(*nodes[2]);
    bool served = v.ok() && v.Put(mine) == mine.size();
    served = served && WaitFor(milliseconds(15000), [&] {
      std::vector<bool> hit;
      uint64_t wrong = 0;
      bool ok = joined() && v.Get(mine, &hit, &wrong) &&
                std::all_of(hit.begin(), hit.end(), [](bool h) { return h; });
      std::vector<bool> hit_a;
      ok = ok && a.Get(mine, &hit_a, &wrong) &&
           std::all_of(hit_a.begin(), hit_a.end(), [](bool h) { return h; });
      std::vector<bool> hit_v;
      ok = ok && v.Get(of_a, &hit_v, &wrong) &&
           std::all_of(hit_v.begin(), hit_v.end(), [](bool h) { return h; });
      r.wrong += wrong;
      return ok;
    }, milliseconds(20));
    r.serve_ms.push_back(MsSince(killed));
    EXPECT_TRUE(served) << "round " << round << "\n" << nodes[2]->Log();
    if (!served) break;
  }
  stop = true;
  for (auto& t : threads) t.join();
  r.wrong += s.wrong_bytes;
  r.over_3s = s.ops_over_3s;
  EXPECT_EQ(s.call_errors, 0u);
  EXPECT_EQ(s.local_misses, 0u);  // the survivors' own keys never miss
  EXPECT_GT(s.ops, 0u);
  return r;
}

void Report(const char* mode, const ChurnResult& r) {
  int64_t worst = r.serve_ms.empty() ? -1 : *std::max_element(r.serve_ms.begin(), r.serve_ms.end());
  std::string all;
  for (int64_t ms : r.serve_ms) all += (all.empty() ? "" : ",") + std::to_string(ms);
  std::printf("SUMMARY {\"test\":\"churn_%s\",\"rounds\":%zu,\"serve_again_ms\":[%s],"
              "\"worst_ms\":%lld,\"wrong_bytes\":%llu,\"ops_over_3s\":%llu}\n",
              mode, r.serve_ms.size(), all.c_str(), (long long)worst,
              (unsigned long long)r.wrong, (unsigned long long)r.over_3s);
  EXPECT_EQ(r.serve_ms.size(), static_cast<size_t>(kRounds));
  EXPECT_LE(worst, (kLeaseTtl + milliseconds(2000)).count());
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.over_3s, 0u);
}

class ChurnTest : public EtcdClusterTest {
 protected:
  ChurnTest() : EtcdClusterTest("churn") {}
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    EtcdClusterTest::SetUp();
  }
  std::vector<std::string> FixedPortArgs(const std::string& id, int port) const {
    std::vector<std::string> args = Args(id);
    auto it = std::find(args.begin(), args.end(), "--peer-port");
    *(it + 1) = std::to_string(port);
    return args;
  }
};

TEST_F(ChurnTest, EtcdKillNineAndImmediateRestartFifteenTimes) {
  StaticCluster ports;  // only for its free ports
  ASSERT_TRUE(ports.PickPorts({"a", "b", "c"}));
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  const char* ids[] = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(StartNodeWith(FixedPortArgs(ids[i], ports.ports[i])));
    ASSERT_NE(nodes.back(), nullptr);
  }
  for (auto& n : nodes) {
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  }
  ChurnResult r = Churn(
      nodes, [&] { return StartNodeWith(FixedPortArgs("c", ports.ports[2])); },
      [&] {
        // Both survivors list c with the incarnation the new c holds.
        auto mc = Members(*nodes[2]), ma = Members(*nodes[0]), mb = Members(*nodes[1]);
        return mc.count("c") && ma.count("c") && mb.count("c") && ma["c"] == mc["c"] &&
               mb["c"] == mc["c"];
      });
  Report("etcd", r);
}

TEST(ChurnStaticTest, StaticKillNineAndImmediateRestartFifteenTimes) {
  signal(SIGPIPE, SIG_IGN);
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b", "c"}));
  ASSERT_TRUE(c.StartNodes({"a", "b", "c"}));
  ChurnResult r = Churn(
      c.nodes,
      [&] {
        std::string log;
        auto n = NodeProcess::Start(
            {"--node-id", "c", "--peers", c.members, "--peer-port", std::to_string(c.ports[2])}, "",
            &log);
        EXPECT_NE(n, nullptr) << log;
        return n;
      },
      [] { return true; });
  Report("static", r);
}

}  // namespace
}  // namespace kvpool::testing
