// Cluster integration tests: real kvpool-node processes and a real etcd.
// Membership as /api/v1/members reports it: joining, duplicate ids, a
// kill -9 leaving the view within the lease TTL, a restart coming back with
// a higher incarnation; kvpoolctl members/shards.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/etcd_test_util.h"
#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"

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

// A client of one node's local socket.
class Conn {
 public:
  // copy_mode: bytes travel inline (get); otherwise through the mapped
  // segment (acquire, then a copy out).
  explicit Conn(const NodeProcess& n, bool copy_mode = true) {
    kvpool_options o;
    kvpool_options_init(&o);
    o.socket_path = n.socket().c_str();
    o.copy_mode = copy_mode ? 1 : 0;
    o.timeout_ms = 10000;
    kvpool_status st;
    c_ = kvpool_open(&o, &st);
    EXPECT_NE(c_, nullptr) << kvpool_status_name(st) << " " << kvpool_last_error();
  }
  ~Conn() {
    if (c_ != nullptr) kvpool_close(c_);
  }
  bool ok() const { return c_ != nullptr; }

  void Put(const std::vector<kvpool_key_id>& ids, const std::vector<std::vector<uint8_t>>& vals) {
    std::vector<const void*> ptrs;
    std::vector<uint64_t> sizes;
    for (const auto& v : vals) {
      ptrs.push_back(v.data());
      sizes.push_back(v.size());
    }
    std::vector<kvpool_status> st(ids.size());
    ASSERT_EQ(kvpool_put(c_, ids.data(), ptrs.data(), sizes.data(), ids.size(), st.data()), KVPOOL_OK)
        << kvpool_last_error();
    for (auto s : st) EXPECT_EQ(s, KVPOOL_OK);
  }

  // Per key: the value, or nullopt on a miss.
  std::vector<std::optional<std::vector<uint8_t>>> Get(const std::vector<kvpool_key_id>& ids) {
    const size_t cap = 1 << 20;
    std::vector<std::vector<uint8_t>> bufs(ids.size(), std::vector<uint8_t>(cap, 0xee));
    std::vector<void*> ptrs;
    for (auto& b : bufs) ptrs.push_back(b.data());
    std::vector<uint64_t> caps(ids.size(), cap), got(ids.size());
    std::vector<kvpool_status> st(ids.size());
    std::vector<std::optional<std::vector<uint8_t>>> out(ids.size());
    EXPECT_EQ(kvpool_get(c_, ids.data(), ptrs.data(), caps.data(), ids.size(), got.data(), st.data()),
              KVPOOL_OK)
        << kvpool_last_error();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (st[i] == KVPOOL_OK) {
        bufs[i].resize(got[i]);
        out[i] = std::move(bufs[i]);
      } else {
        EXPECT_EQ(st[i], KVPOOL_NOT_FOUND);
      }
    }
    return out;
  }

  size_t ExistsCount(const std::vector<kvpool_key_id>& ids) {
    std::vector<uint8_t> hits(ids.size());
    size_t prefix = 0;
    EXPECT_EQ(kvpool_exists(c_, ids.data(), ids.size(), hits.data(), &prefix), KVPOOL_OK);
    size_t n = 0;
    for (uint8_t h : hits) n += h;
    return n;
  }

 private:
  kvpool_client* c_ = nullptr;
};

std::vector<kvpool_key_id> Keys(const std::string& prefix, size_t n) {
  std::vector<kvpool_key_id> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(Client::KeyId("cluster-it", prefix + std::to_string(i)));
  return ids;
}

std::vector<std::vector<uint8_t>> Values(uint64_t seed, size_t n) {
  std::vector<std::vector<uint8_t>> v;
  for (size_t i = 0; i < n; ++i) v.push_back(Pattern(seed + i, 1 + ((i * 37117) % 300000)));
  return v;
}

TEST_F(ClusterTest, RemoteReadsAreByteExactAndADeadHolderIsAMiss) {
  auto a = StartNode("a"), b = StartNode("b"), c = StartNode("c");
  ASSERT_TRUE(a && b && c);
  for (NodeProcess* n : {a.get(), b.get(), c.get()}) {
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  }
  Conn ca(*a), cb(*b), cc(*c, /*copy_mode=*/false);
  ASSERT_TRUE(ca.ok() && cb.ok() && cc.ok());
  const size_t kN = 24;
  auto shared = Keys("shared", kN), only_a = Keys("only-a", kN), via_b = Keys("via-b", kN);
  auto shared_v = Values(100, kN), only_a_v = Values(200, kN), via_b_v = Values(300, kN);
  ca.Put(shared, shared_v);
  ca.Put(only_a, only_a_v);
  ca.Put(via_b, via_b_v);

  // Publishing is asynchronous (a few ms): wait until B sees every key.
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(shared) == kN; }));
  EXPECT_TRUE(WaitFor(milliseconds(3000), [&] { return cc.ExistsCount(only_a) == kN; }));

  for (Conn* conn : {&cb, &cc}) {
    auto got = conn->Get(shared);
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(*got[i], shared_v[i]) << i;
    }
  }
  auto got_b = cb.Get(via_b);  // replicas on B
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(got_b[i].has_value()) << i;
    EXPECT_EQ(*got_b[i], via_b_v[i]) << i;
  }
  EXPECT_GT(b->Metric("kvpool_remote_hits_total"), 0);
  // B's exists answers were reused by its gets (no second lookup round).
  EXPECT_GT(b->Metric("kvpool_remote_lookup_cache_hits_total"), 0);
  // Every key has one directory entry, at its home.
  double dir_entries = 0;
  for (NodeProcess* n : {a.get(), b.get(), c.get()}) {
    dir_entries += n->Metric("kvpool_directory_entries");
    EXPECT_GT(n->Metric("kvpool_directory_bytes"), 0);
  }
  EXPECT_EQ(dir_entries, 3.0 * kN);
  // B's replicas are published before A dies.
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] {
    return b->Metric("kvpool_publish_items_total") >= static_cast<double>(2 * kN);
  }));

  a->Stop(SIGKILL);
  // Right away (A still in the view): A-only keys miss within the deadline.
  auto t0 = steady_clock::now();
  auto miss = cb.Get(only_a);
  EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(5));
  for (size_t i = 0; i < kN; ++i) EXPECT_FALSE(miss[i].has_value()) << i;

  // Once A has left the view, B's replicas still serve C (their shards'
  // new homes learned of them from B's replay), and A-only keys miss fast.
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return Members(*b).count("a") == 0 && Members(*c).count("a") == 0;
  }));
  std::vector<std::optional<std::vector<uint8_t>>> got_c;
  EXPECT_TRUE(WaitFor(milliseconds(3000), [&] {
    got_c = cc.Get(via_b);
    for (const auto& g : got_c) {
      if (!g) return false;
    }
    return true;
  }));
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(got_c[i].has_value()) << i;
    EXPECT_EQ(*got_c[i], via_b_v[i]) << i;
  }
  t0 = steady_clock::now();
  miss = cc.Get(only_a);
  EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(3));
  for (size_t i = 0; i < kN; ++i) EXPECT_FALSE(miss[i].has_value()) << i;
  EXPECT_EQ(cc.ExistsCount(only_a), 0u);
}

TEST_F(ClusterTest, AHungHolderIsAMissWithinTheDeadlineThenCoolsDown) {
  // A long lease: the hung node stays in the view while B reads.
  auto args = [&](const std::string& id) {
    return std::vector<std::string>{"--node-id", id, "--etcd", etcd_->endpoint(), "--cluster",
                                    "hung", "--peer-port", "0", "--lease-ttl", "30s",
                                    "--peer-lookup-timeout", "300ms", "--peer-fetch-timeout",
                                    "800ms", "--peer-cooldown", "10s"};
  };
  std::string log;
  auto a = NodeProcess::Start(args("a"), "", &log);
  ASSERT_NE(a, nullptr) << log;
  auto b = NodeProcess::Start(args("b"), "", &log);
  ASSERT_NE(b, nullptr) << log;
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*b).size() == 2; }));
  Conn ca(*a), cb(*b);
  auto ids = Keys("hung", 16);
  ca.Put(ids, Values(500, 16));
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == ids.size(); }));

  ASSERT_EQ(kill(a->pid(), SIGSTOP), 0);
  auto t0 = steady_clock::now();
  auto got = cb.Get(ids);
  auto first = steady_clock::now() - t0;
  for (const auto& g : got) EXPECT_FALSE(g.has_value());
  // One lookup round (300 ms) then one fetch round (800 ms), with slack.
  EXPECT_LT(first, milliseconds(2500));
  // A is cooling down now: the next miss does not wait for it.
  t0 = steady_clock::now();
  got = cb.Get(ids);
  EXPECT_LT(steady_clock::now() - t0, milliseconds(250));
  for (const auto& g : got) EXPECT_FALSE(g.has_value());
  EXPECT_GT(b->Metric("kvpool_peer_cooldowns_total"), 0);
  kill(a->pid(), SIGCONT);
}

bool Fenced(const NodeProcess& n) {
  auto j = nlohmann::json::parse(n.HttpGet("/api/v1/members"), nullptr, false);
  return !j.is_discarded() && j.value("fenced", false);
}

TEST_F(ClusterTest, FencedNodesMissThenComeBackAndRepublish) {
  auto a = StartNode("a"), b = StartNode("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*b).size() == 2; }));
  Conn ca(*a), cb(*b);
  auto ids = Keys("fence", 16);
  auto vals = Values(600, 16);
  ca.Put(ids, vals);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == ids.size(); }));
  uint64_t inc_a = Members(*b)["a"];

  // etcd hangs past the lease TTL: both nodes fence themselves; a fenced
  // node does no remote work, so B's reads of A's keys miss (local ones
  // still work).
  etcd_->Pause();
  ASSERT_TRUE(WaitFor(milliseconds(4000), [&] { return Fenced(*b); }));
  for (const auto& g : cb.Get(ids)) EXPECT_FALSE(g.has_value());
  EXPECT_EQ(ca.ExistsCount(ids), ids.size());
  std::this_thread::sleep_for(milliseconds(2500));  // let the leases expire
  etcd_->Resume();

  // Both re-register with new incarnations; A republishes everything under
  // its new one, so B finds the keys again.
  ASSERT_TRUE(WaitFor(milliseconds(8000), [&] {
    auto m = Members(*b);
    return !Fenced(*b) && m.size() == 2 && m["a"] > inc_a;
  })) << b->HttpGet("/api/v1/members");
  std::vector<std::optional<std::vector<uint8_t>>> got;
  EXPECT_TRUE(WaitFor(milliseconds(5000), [&] {
    got = cb.Get(ids);
    for (const auto& g : got) {
      if (!g) return false;
    }
    return true;
  }));
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(*got[i], vals[i]) << i;
  }
}

TEST_F(ClusterTest, AHolderBackUnderANewIncarnationRepublishesEverything) {
  auto a = StartNode("a"), b = StartNode("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*b).size() == 2; }));
  Conn ca(*a), cb(*b);
  auto ids = Keys("reinc", 32);
  auto vals = Values(700, 32);
  ca.Put(ids, vals);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == ids.size(); }));
  uint64_t inc_a = Members(*b)["a"];

  // A hangs past its lease: B drops it (and its directory entries, also of
  // keys whose home is B). Resumed, A fences, registers again under a new
  // incarnation, and must tell every home what it holds again.
  ASSERT_EQ(kill(a->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*b).count("a") == 0; }));
  ASSERT_EQ(kill(a->pid(), SIGCONT), 0);
  ASSERT_TRUE(WaitFor(milliseconds(8000), [&] {
    auto m = Members(*b);
    return m.count("a") == 1 && m["a"] > inc_a;
  })) << b->HttpGet("/api/v1/members");
  std::vector<std::optional<std::vector<uint8_t>>> got;
  EXPECT_TRUE(WaitFor(milliseconds(5000), [&] {
    got = cb.Get(ids);
    for (const auto& g : got) {
      if (!g) return false;
    }
    return true;
  }));
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(*got[i], vals[i]) << i;
  }
}

uint64_t DramEntries(const NodeProcess& n) {
  auto j = nlohmann::json::parse(n.HttpGet("/api/v1/status"), nullptr, false);
  return j.is_discarded() ? 0 : j["dram"]["entries"].get<uint64_t>();
}

TEST_F(ClusterTest, PlacementHomeSpreadsValuesOverTheHomes) {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* id : {"a", "b", "c"}) {
    auto args = Args(id);
    args.insert(args.end(), {"--placement", "home"});
    std::string log;
    nodes.push_back(NodeProcess::Start(args, "", &log));
    ASSERT_NE(nodes.back(), nullptr) << log;
  }
  for (auto& n : nodes) {
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  }
  Conn ca(*nodes[0]), cb(*nodes[1]);
  const size_t kN = 60;
  auto ids = Keys("home", kN);
  auto vals = Values(800, kN);
  ca.Put(ids, vals);
  // Each value ends up on its home only (A keeps about a third): once B and
  // C hold theirs, every value is in exactly one place.
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    uint64_t a = DramEntries(*nodes[0]), b = DramEntries(*nodes[1]), c = DramEntries(*nodes[2]);
    return b > 0 && c > 0 && a + b + c == kN &&
           nodes[0]->Metric("kvpool_placement_moved_total") == static_cast<double>(b + c);
  })) << DramEntries(*nodes[0]) << " " << DramEntries(*nodes[1]) << " " << DramEntries(*nodes[2]);
  EXPECT_GT(DramEntries(*nodes[0]), 0u);
  EXPECT_EQ(nodes[0]->Metric("kvpool_placement_kept_total"), 0);

  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == kN; }));
  for (Conn* conn : {&ca, &cb}) {
    auto got = conn->Get(ids);
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(*got[i], vals[i]) << i;
    }
  }
}

// A free loopback TCP port (bound and released: a small race, fine here).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

TEST(StaticClusterTest, PeersListServesRemoteReads) {
  int pa = FreePort(), pb = FreePort();
  ASSERT_TRUE(pa > 0 && pb > 0 && pa != pb);
  std::string peers = "a=127.0.0.1:" + std::to_string(pa) + ",b=127.0.0.1:" + std::to_string(pb);
  std::string log;
  auto a = NodeProcess::Start({"--node-id", "a", "--peers", peers, "--peer-port", std::to_string(pa)},
                              "", &log);
  ASSERT_NE(a, nullptr) << log;
  auto b = NodeProcess::Start({"--node-id", "b", "--peers", peers, "--peer-port", std::to_string(pb)},
                              "", &log);
  ASSERT_NE(b, nullptr) << log;
  EXPECT_EQ(Members(*a).size(), 2u);
  Conn ca(*a), cb(*b);
  auto ids = Keys("static", 8);
  auto vals = Values(400, 8);
  ca.Put(ids, vals);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == ids.size(); }));
  auto got = cb.Get(ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(*got[i], vals[i]) << i;
  }
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
