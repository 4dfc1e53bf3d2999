// Cluster integration tests: real kvpool-node processes and a real etcd.
// Membership as /api/v1/members reports it: joining, duplicate ids, a
// kill -9 leaving the view within the lease TTL, a restart coming back with
// a higher incarnation; kvpoolctl members/shards.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/etcd_test_util.h"
#include "harness/node_process.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// node id -> incarnation, as one node's /api/v1/members lists them.
std::map<std::string, uint64_t> Members(const NodeProcess& n) {
  std::map<std::string, uint64_t> out;
  int status = 0;
  std::string body = n.HttpGet("/api/v1/members", &status);
  if (status != 200) return out;
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded()) return out;
  for (const auto& m : j["members"]) out[m["node_id"]] = m["incarnation"].get<uint64_t>();
  return out;
}

// Polls (real processes, real leases: there is no clock to fake) until
// pred holds or the timeout passes; returns whether it held.
template <typename Pred>
bool WaitFor(milliseconds timeout, Pred pred) {
  auto deadline = steady_clock::now() + timeout;
  while (steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return pred();
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdTestServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(etcd).value();
  }

  std::vector<std::string> Args(const std::string& id) const {
    return {"--node-id", id, "--etcd", etcd_->endpoint(), "--cluster", "it",
            "--peer-port", "0", "--lease-ttl", "2s"};
  }

  std::unique_ptr<NodeProcess> StartNode(const std::string& id) {
    std::string log;
    auto n = NodeProcess::Start(Args(id), "", &log);
    EXPECT_NE(n, nullptr) << log;
    return n;
  }

  std::unique_ptr<EtcdTestServer> etcd_;
};

TEST_F(ClusterTest, ThreeNodesSeeEachOtherAndCtlReportsThem) {
  auto a = StartNode("a"), b = StartNode("b"), c = StartNode("c");
  ASSERT_TRUE(a && b && c);
  for (NodeProcess* n : {a.get(), b.get(), c.get()}) {
    EXPECT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }))
        << "members seen by one node: " << n->HttpGet("/api/v1/members");
  }
  auto ma = Members(*a);
  EXPECT_EQ(ma, Members(*b));
  EXPECT_EQ(ma, Members(*c));
  for (const auto& [id, inc] : ma) EXPECT_GT(inc, 0u) << id;

  // The status page lists the same view.
  auto st = nlohmann::json::parse(a->HttpGet("/api/v1/status"));
  EXPECT_EQ(st["members"].size(), 3u);

  std::string admin = "127.0.0.1:" + std::to_string(b->admin_port());
  std::string out;
  ASSERT_EQ(RunCommand({CtlBinary(), "members", "--admin", admin}, &out), 0) << out;
  EXPECT_NE(out.find("3 members"), std::string::npos) << out;
  for (const char* id : {"a ", "b ", "c "}) EXPECT_NE(out.find(id), std::string::npos) << out;
  ASSERT_EQ(RunCommand({CtlBinary(), "shards", "--admin", admin}, &out), 0) << out;
  EXPECT_NE(out.find("total 4096 shards over 3 nodes"), std::string::npos) << out;
}

TEST_F(ClusterTest, DuplicateNodeIdIsRefused) {
  auto a = StartNode("dup");
  ASSERT_NE(a, nullptr);
  std::vector<std::string> argv = {"/usr/bin/timeout", "20", NodeBinary(), "--socket",
                                   a->dir() + "/second.sock", "--admin-port", "0",
                                   "--dram-capacity", "64MiB", "--slab-size", "1MiB"};
  for (auto& s : Args("dup")) argv.push_back(s);
  std::string out;
  int rc = RunCommand(argv, &out, /*merge_stderr=*/true);
  EXPECT_EQ(rc, 1) << (rc == 124 ? "the duplicate node kept running: " : "") << out;
  EXPECT_NE(out.find("node id already live: dup"), std::string::npos) << out;
  // The first node is unaffected.
  EXPECT_EQ(Members(*a).size(), 1u);
}

TEST_F(ClusterTest, KilledNodeLeavesWithinTtlAndRejoinsWithNewIncarnation) {
  auto a = StartNode("a"), b = StartNode("b"), c = StartNode("c");
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return Members(*a).size() == 3 && Members(*b).size() == 3;
  }));
  uint64_t old_inc = Members(*a)["c"];

  auto killed = steady_clock::now();
  c->Stop(SIGKILL);
  // TTL 2 s + 2 s; polling adds at most 50 ms.
  EXPECT_TRUE(WaitFor(milliseconds(4000), [&] {
    return Members(*a).count("c") == 0 && Members(*b).count("c") == 0;
  })) << a->HttpGet("/api/v1/members");
  auto gone_ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - killed).count();
  EXPECT_LE(gone_ms, 4100);

  c = StartNode("c");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(WaitFor(milliseconds(5000), [&] {
    return Members(*a).count("c") == 1 && Members(*b).count("c") == 1;
  }));
  EXPECT_GT(Members(*a)["c"], old_inc);
  EXPECT_EQ(Members(*a), Members(*c));
}

TEST(StandaloneNodeTest, MembersListsOnlyItself) {
  auto n = NodeProcess::Start();
  ASSERT_NE(n, nullptr);
  auto m = Members(*n);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m.begin()->first, "test-node");
}

TEST(NodeOptionsTest, NonLoopbackPeerAddressNeedsInsecure) {
  std::string out;
  int rc = RunCommand({"/usr/bin/timeout", "20", NodeBinary(), "--peers", "a=10.0.0.1:7000",
                           "--node-id", "a", "--peer-port", "7000", "--peer-address", "0.0.0.0",
                           "--admin-port", "0"},
                          &out, /*merge_stderr=*/true);
  EXPECT_EQ(rc, 1) << out;  // refused at start, before anything binds
  EXPECT_NE(out.find("--insecure"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing
