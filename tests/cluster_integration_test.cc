// Cluster integration tests: real kvpool-node processes and a real etcd.
// Membership as /api/v1/members reports it: joining, duplicate ids, a
// kill -9 leaving the view within the lease TTL, a restart coming back with
// a higher incarnation; kvpoolctl members/shards.
#include <gtest/gtest.h>
#include <signal.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness/cluster_harness.h"
#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "membership/etcd_test_util.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class ClusterTest : public EtcdClusterTest {
 protected:
  ClusterTest() : EtcdClusterTest("it") {}

  std::unique_ptr<NodeProcess> StartNode(const std::string& id) { return StartNodeWith(Args(id)); }
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

  // The cluster view (/api/v1/cluster, asked of one node): every member's
  // figures side by side, each as that member's own status says them.
  auto cl = nlohmann::json::parse(b->HttpGet("/api/v1/cluster"));
  ASSERT_EQ(cl["members"].size(), 3u) << cl.dump();
  std::map<std::string, NodeProcess*> by_id = {{"a", a.get()}, {"b", b.get()}, {"c", c.get()}};
  for (const auto& m : cl["members"]) {
    ASSERT_FALSE(m.contains("error")) << m.dump();
    const std::string id = m["node_id"];
    ASSERT_EQ(by_id.count(id), 1u) << id;
    EXPECT_EQ(m["self"], id == "b");
    auto own = nlohmann::json::parse(by_id[id]->HttpGet("/api/v1/status"));
    EXPECT_EQ(m["version"], own["version"]);
    EXPECT_EQ(m["dram"]["capacity_bytes"], own["dram"]["capacity_bytes"]) << id;
    EXPECT_EQ(m["dram"]["entries"], own["dram"]["entries"]) << id;
    EXPECT_GT(m["uptime_s"].get<double>(), 0) << id;
  }
}

TEST_F(ClusterTest, DuplicateNodeIdIsRefused) {
  auto a = StartNode("dup");
  ASSERT_NE(a, nullptr);
  std::vector<std::string> argv = {"/usr/bin/timeout", "20", NodeBinary(), "--socket",
                                   a->dir() + "/second.sock", "--admin-port", "0",
                                   "--dram-capacity", "64MiB", "--slab-size", "1MiB"};
  for (auto& s : Args("dup")) argv.push_back(s);
  argv.insert(argv.end(), {"--cluster-key-file", TestClusterKeyFile()});
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
  // c has joined: its view replays reached both peers. A node killed inside
  // its first UCX handshake with a peer can abort that peer (UCX 1.13.1, see
  // docs/reliability.md, "Not promised today"); that is not what this tests.
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return PeerCallsOk(*c) >= 2; }))
      << PeerCallsOk(*c);

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
  })) << "a: " << a->HttpGet("/api/v1/members") << "\nb: " << b->HttpGet("/api/v1/members")
      << "\nlog of a:\n" << a->Log() << "\nlog of b:\n" << b->Log();
  EXPECT_GT(Members(*a)["c"], old_inc);
  EXPECT_EQ(Members(*a), Members(*c));
}

// A node killed and started again inside its old lease serves its local
// clients from its first moment; it joins (remote work, /readyz/cluster)
// once the old lease is gone, and what it stored meanwhile is published
// then: a peer reads it.
TEST_F(ClusterTest, ARestartedNodeServesLocalClientsAtOnceAndJoinsOnceItsOldLeaseExpires) {
  auto a = StartNode("a"), b = StartNode("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return Members(*a).size() == 2 && Members(*b).size() == 2;
  }));
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return PeerCallsOk(*b) >= 1; }));
  const uint64_t old_inc = Members(*a)["b"];
  b->Stop(SIGKILL);  // its lease (2 s) stays in etcd

  const auto t0 = steady_clock::now();
  b = StartNode("b");
  ASSERT_NE(b, nullptr);
  auto ids = NumberedKeys("restart", "k", 8);
  ByteValues vals;
  for (size_t i = 0; i < ids.size(); ++i) vals.push_back(Pattern(900 + i, 4096 + i));
  kvpool_client* cb = OpenLocal(*b, /*copy_mode=*/true);
  ASSERT_NE(cb, nullptr);
  std::vector<kvpool_status> st(ids.size(), KVPOOL_OK);
  ASSERT_EQ(PutValues(cb, ids, vals, &st), KVPOOL_OK) << kvpool_last_error();
  ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(cb, ids, 1 << 16), vals));
  const int64_t first_get_ms = MsSince(t0);
  std::printf("metric restart_first_local_get_ms %lld\n", static_cast<long long>(first_get_ms));
  EXPECT_LT(first_get_ms, 1000) << b->Log();
  // Still joining: local work yes, cluster work not yet.
  int code = 0;
  std::string body = b->HttpGet("/readyz", &code);
  EXPECT_EQ(code, 200);
  std::string cluster_body = b->HttpGet("/readyz/cluster", &code);
  if (MsSince(t0) < 1000) {  // the old lease had 2 s when b was killed
    EXPECT_EQ(code, 503) << cluster_body;
    EXPECT_NE(body.find("not yet for cluster work: joining"), std::string::npos) << body;
    auto status = nlohmann::json::parse(b->HttpGet("/api/v1/status"));
    EXPECT_EQ(status["readiness"]["local"], "ready") << status["readiness"].dump();
    EXPECT_EQ(status["readiness"]["cluster"], "joining") << status["readiness"].dump();
  }
  // Joined within the old lease's TTL plus the margin, as a new incarnation.
  EXPECT_TRUE(WaitFor(milliseconds(5000), [&] {
    int c = 0;
    b->HttpGet("/readyz/cluster", &c);
    return c == 200;
  })) << b->Log();
  const int64_t joined_ms = MsSince(t0);
  std::printf("metric restart_cluster_ready_ms %lld\n", static_cast<long long>(joined_ms));
  EXPECT_LT(joined_ms, 2000 + 2000 + 500);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return Members(*a)["b"] > old_inc; }));
  // What b stored while joining was published when it joined.
  kvpool_client* ca = OpenLocal(*a, /*copy_mode=*/true);
  ASSERT_NE(ca, nullptr);
  MaybeByteValues got;
  EXPECT_TRUE(WaitFor(milliseconds(3000), [&] {
    got = GetValues(ca, ids, 1 << 16);
    return AllHit(got);
  }));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  kvpool_close(ca);
  kvpool_close(cb);
}

// With a cluster key, registrations carry proofs of holding it: a node that
// registers in the same etcd without the key is left out of the members'
// views and takes no shard home, so every value put on one member reads
// from the other.
TEST_F(ClusterTest, ANodeRegisteredWithoutTheClusterKeyTakesNoShardHome) {
  char tmpl[] = "/tmp/kvpool-proof-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string key = dir + "/cluster.key";
  {
    std::FILE* f = std::fopen(key.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b\n", f);
    std::fclose(f);
    chmod(key.c_str(), 0600);
  }
  auto with_key = [&](const std::string& id) {
    auto args = Args(id);
    args.insert(args.end(), {"--cluster-key-file", key});
    return StartNodeWith(args);
  };
  auto a = with_key("a"), b = with_key("b");
  auto x_args = Args("x");  // the same etcd and cluster, no key
  x_args.push_back("--insecure");
  auto x = StartNodeWith(x_args);
  ASSERT_TRUE(a && b && x);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*x).size() == 3; }))
      << x->HttpGet("/api/v1/members");
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return Members(*a).size() == 2 && Members(*b).size() == 2;
  }));
  for (NodeProcess* n : {a.get(), b.get()}) {
    EXPECT_EQ(Members(*n).count("x"), 0u) << n->HttpGet("/api/v1/members");
    EXPECT_EQ(n->Metric("kvpool_membership_unproven_members"), 1);
    EXPECT_EQ(n->Metric("kvpool_membership_unproven_registrations_total"), 1);
    auto shards = MembersJson(*n)["shards"]["owned"];
    EXPECT_FALSE(shards.contains("x")) << shards.dump();
  }
  EXPECT_EQ(x->Metric("kvpool_membership_unproven_members"), 0);  // it checks nothing
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return PeerCallsOk(*b) >= 1; }));
  const size_t kN = 100;
  auto ids = NumberedKeys("proof", "k", kN);
  ByteValues vals;
  for (size_t i = 0; i < kN; ++i) vals.push_back(Pattern(7000 + i, 2048));
  kvpool_client* ca = OpenLocal(*a, true);
  kvpool_client* cb = OpenLocal(*b, true);
  ASSERT_TRUE(ca != nullptr && cb != nullptr);
  std::vector<kvpool_status> st(kN, KVPOOL_OK);
  ASSERT_EQ(PutValues(ca, ids, vals, &st), KVPOOL_OK);
  auto got = GetValues(cb, ids, 1 << 16);
  size_t hits = 0;
  for (const auto& g : got) hits += g.has_value();
  std::printf("metric keyless_member_puts_read_from_peer_pct %g\n", 100.0 * hits / kN);
  EXPECT_EQ(hits, kN);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  kvpool_close(ca);
  kvpool_close(cb);
  // The proof-less node stopping changes nothing for the members' views.
  x->Stop();
  EXPECT_TRUE(WaitFor(milliseconds(4000), [&] {
    return a->Metric("kvpool_membership_unproven_members") == 0;
  }));
  EXPECT_EQ(Members(*a).size(), 2u);
  std::filesystem::remove_all(dir);
}

// A key rotation as docs/cluster.md describes it keeps every member proven:
// a registration proves every key its node holds, so nodes holding the old
// and the new key, and one holding only the new key, all see each other.
TEST_F(ClusterTest, MembershipProofsHoldThroughAKeyRotation) {
  char tmpl[] = "/tmp/kvpool-rotate-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string k1 = "1111111111111111111111111111111111111111111111111111111111111111";
  const std::string k2 = "2222222222222222222222222222222222222222222222222222222222222222";
  auto key_file = [&](const std::string& name, const std::vector<std::string>& keys) {
    const std::string path = dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    for (const auto& k : keys) std::fprintf(f, "%s\n", k.c_str());
    std::fclose(f);
    chmod(path.c_str(), 0600);
    return path;
  };
  auto start = [&](const std::string& id, const std::string& key) {
    auto args = Args(id);
    args.insert(args.end(), {"--cluster-key-file", key});
    return StartNodeWith(args);
  };
  auto a = start("a", key_file("old-first", {k1, k2}));
  auto b = start("b", key_file("new-first", {k2, k1}));
  auto c = start("c", key_file("new-only", {k2}));
  ASSERT_TRUE(a && b && c);
  for (NodeProcess* n : {a.get(), b.get(), c.get()}) {
    EXPECT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }))
        << n->HttpGet("/api/v1/members");
    EXPECT_EQ(n->Metric("kvpool_membership_unproven_members"), 0);
  }
  std::filesystem::remove_all(dir);
}

// A client of one node's local socket.
class Conn {
 public:
  // copy_mode: bytes travel inline (get); otherwise through the mapped
  // segment (acquire, then a copy out).
  explicit Conn(const NodeProcess& n, bool copy_mode = true) : c_(OpenLocal(n, copy_mode)) {}
  ~Conn() {
    if (c_ != nullptr) kvpool_close(c_);
  }
  bool ok() const { return c_ != nullptr; }

  void Put(const std::vector<kvpool_key_id>& ids, const std::vector<std::vector<uint8_t>>& vals) {
    std::vector<kvpool_status> st(ids.size());
    ASSERT_EQ(PutValues(c_, ids, vals, &st), KVPOOL_OK) << kvpool_last_error();
    for (auto s : st) EXPECT_EQ(s, KVPOOL_OK);
  }

  // Per key: the value, or nullopt on a miss.
  std::vector<std::optional<std::vector<uint8_t>>> Get(const std::vector<kvpool_key_id>& ids) {
    return GetValues(c_, ids, 1 << 20);
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
  return NumberedKeys("cluster-it", prefix, n);
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
    ASSERT_NO_FATAL_FAILURE(ExpectValues(got, shared_v));
  }
  // Placement local keeps a writer's keys on its node: C's reads of A's
  // 24-key batches are chain reads, which ask A which keys it holds.
  EXPECT_GT(c->Metric("kvpool_remote_holder_lookups_total"), 0);
  // Read twice through B: a value B fetches again is kept as a replica
  // (--read-replicas repeat), the shared ones B read once are not.
  for (int round = 0; round < 2; ++round) {
    auto got_b = cb.Get(via_b);
    ASSERT_NO_FATAL_FAILURE(ExpectValues(got_b, via_b_v));
  }
  EXPECT_EQ(b->Metric("kvpool_remote_hits_total"), 3.0 * kN);
  EXPECT_EQ(b->Metric("kvpool_remote_replicas_kept_total"), 1.0 * kN);
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
    return b->Metric("kvpool_publish_items_total") >= static_cast<double>(kN);
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
    return AllHit(got_c);
  }));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got_c, via_b_v));
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

TEST_F(ClusterTest, EtcdHungPastTheTtlThenNodesComeBackAndRepublish) {
  auto a = StartNode("a"), b = StartNode("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*b).size() == 2; }));
  Conn ca(*a), cb(*b);
  auto ids = Keys("fence", 16);
  auto vals = Values(600, 16);
  ca.Put(ids, vals);
  auto later = Keys("fence-later", 16);  // read by B only after etcd is back
  auto later_vals = Values(700, 16);
  ca.Put(later, later_vals);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] {
    return cb.ExistsCount(ids) == ids.size() && cb.ExistsCount(later) == later.size();
  }));
  uint64_t inc_a = Members(*b)["a"];

  // etcd hangs past the lease TTL: neither node can renew, each vouches
  // that etcd is down for the other too, so neither fences and B still
  // reads A's keys.
  etcd_->Pause();
  ASSERT_TRUE(WaitFor(milliseconds(4000), [&] { return EtcdOutage(*a) && EtcdOutage(*b); }));
  EXPECT_FALSE(Fenced(*a) || Fenced(*b));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(cb.Get(ids), vals));
  // Nor past the leases' TTL (watched for 2.5 s).
  EXPECT_FALSE(WaitFor(milliseconds(2500), [&] { return Fenced(*a) || Fenced(*b); }));
  etcd_->Resume();

  // The paused etcd expires the leases it did not see renewed: both fence,
  // re-register with new incarnations, and A republishes everything under
  // its new one, so B finds the keys again.
  ASSERT_TRUE(WaitFor(milliseconds(8000), [&] {
    auto m = Members(*b);
    return !Fenced(*b) && m.size() == 2 && m["a"] > inc_a;
  })) << b->HttpGet("/api/v1/members");
  std::vector<std::optional<std::vector<uint8_t>>> got;
  EXPECT_TRUE(WaitFor(milliseconds(5000), [&] {
    got = cb.Get(later);
    return AllHit(got);
  }));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, later_vals));
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
    return AllHit(got);
  }));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
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
    ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  }
}

// Placement chain: a writer's exists call names a chain; the blocks it
// then puts go, whole, to one node (the least fed by this writer for a new
// chain), and blocks added to the chain later follow them there. Reads through other nodes
// are byte-exact and keep no replica. Both put paths: values inline (put)
// and through reservations (reserve, write, commit).
TEST(StaticClusterTest, PlacementChainKeepsEachChainOnOneNodeAndReadsKeepNoReplicas) {
  StaticCluster sc;
  sc.PickPorts({"a", "b", "c"});
  ASSERT_TRUE(sc.StartNodes({"a", "b", "c"}, {"--placement", "chain"}));
  auto entries = [&] {
    std::vector<uint64_t> e;
    for (auto& n : sc.nodes) e.push_back(DramEntries(*n));
    return e;
  };
  NodeProcess* a = sc.nodes[0].get();
  size_t forwarded_chains = 0, total = 0;
  std::vector<std::vector<kvpool_key_id>> chains;
  std::vector<std::vector<std::vector<uint8_t>>> values;
  std::vector<size_t> holder;
  for (int i = 0; i < 8; ++i) {
    Conn ca(*a, /*copy_mode=*/i % 2 == 0);
    auto ids = Keys("chain" + std::to_string(i), 6);
    auto vals = Values(1000 + 10 * i, 6);
    const auto before = entries();
    EXPECT_EQ(ca.ExistsCount(ids), 0u);  // names the chain; nothing held yet
    ca.Put(ids, vals);
    total += ids.size();
    // The whole chain lands on one node; the others do not change.
    std::vector<uint64_t> after;
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
      after = entries();
      return after[0] + after[1] + after[2] == total;
    })) << after[0] << " " << after[1] << " " << after[2];
    size_t grew = 0, where = 0;
    for (size_t n = 0; n < 3; ++n) {
      if (after[n] == before[n]) continue;
      EXPECT_EQ(after[n], before[n] + ids.size()) << "chain " << i << " split over nodes";
      ++grew;
      where = n;
    }
    EXPECT_EQ(grew, 1u);
    forwarded_chains += where != 0;
    chains.push_back(ids);
    values.push_back(vals);
    holder.push_back(where);
  }
  // Some chains' heads are homed on b or c (8 chains over 3 nodes).
  ASSERT_GT(forwarded_chains, 0u);
  EXPECT_EQ(a->Metric("kvpool_placement_kept_total"), 0);
  EXPECT_GE(a->Metric("kvpool_placement_forwarded_total"), 6.0 * forwarded_chains);

  // A chain held on another node, extended through a: the new blocks follow.
  size_t x = 0;
  while (holder[x] == 0) ++x;
  auto longer = chains[x];
  auto more = Keys("chain-ext", 3);
  longer.insert(longer.end(), more.begin(), more.end());
  auto more_vals = Values(5000, 3);
  {
    Conn ca(*a);
    const auto before = entries();
    EXPECT_EQ(ca.ExistsCount(longer), 6u);  // hits the held prefix
    ca.Put(more, more_vals);
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
      return entries()[holder[x]] == before[holder[x]] + 3;
    }));
    EXPECT_EQ(entries()[0], before[0]);
  }

  // Reads through every node are byte-exact; the readers keep nothing.
  const auto held = entries();
  for (auto& n : sc.nodes) {
    for (bool copy : {true, false}) {
      Conn cn(*n, copy);
      for (size_t i = 0; i < chains.size(); ++i) {
        ASSERT_NO_FATAL_FAILURE(ExpectValues(cn.Get(chains[i]), values[i]));
      }
      ASSERT_NO_FATAL_FAILURE(ExpectValues(cn.Get(more), more_vals));
    }
  }
  EXPECT_EQ(entries(), held);
  EXPECT_GT(sc.nodes[1]->Metric("kvpool_remote_fetches_total") +
                sc.nodes[2]->Metric("kvpool_remote_fetches_total"),
            0);

  // A put no exists call named stays on the writer.
  {
    Conn ca(*a);
    const auto before = entries();
    ca.Put(Keys("unnamed", 4), Values(7000, 4));
    EXPECT_EQ(entries()[0], before[0] + 4);
  }

  // A target that is gone: the chains meant for it are stored on the writer
  // (static members stay in the view, so new chains are still sent to c).
  // Nothing put is lost: a and b together gain every block.
  sc.nodes[2]->Stop(SIGKILL);
  const uint64_t ab = DramEntries(*a) + DramEntries(*sc.nodes[1]);
  Conn ca(*a);
  for (int i = 0; i < 6; ++i) {
    auto ids = Keys("after-kill" + std::to_string(i), 4);
    ca.ExistsCount(ids);  // names the chain (keys homed at c count as misses)
    ca.Put(ids, Values(9000 + 10 * i, 4));
  }
  ASSERT_TRUE(WaitFor(milliseconds(10000), [&] {
    return DramEntries(*a) + DramEntries(*sc.nodes[1]) == ab + 24;
  })) << DramEntries(*a) + DramEntries(*sc.nodes[1]) - ab;
  EXPECT_GE(a->Metric("kvpool_placement_kept_total"), 4);
}

// Placement chain with one shared prefix (a system prompt) that every chain
// grows from: continuations go to the prefix's node only while it has been
// fed up to 1.25 times its share (plus 256 blocks); the rest spread to the
// members fed least. Nothing is lost and every value reads back exact.
TEST(StaticClusterTest, PlacementChainSpreadsChainsThatShareOnePrefix) {
  StaticCluster sc;
  sc.PickPorts({"a", "b", "c"});
  ASSERT_TRUE(sc.StartNodes({"a", "b", "c"}, {"--placement", "chain"}));
  NodeProcess* a = sc.nodes[0].get();
  Conn ca(*a);
  auto prompt = Keys("prompt", 2);
  EXPECT_EQ(ca.ExistsCount(prompt), 0u);
  ca.Put(prompt, Values(100, 2));  // a new chain: on a (nothing fed yet)
  ASSERT_EQ(DramEntries(*a), 2u);
  constexpr size_t kChains = 16, kBlocks = 40;
  std::vector<std::vector<kvpool_key_id>> tails;
  std::vector<std::vector<std::vector<uint8_t>>> vals;
  for (size_t i = 0; i < kChains; ++i) {
    auto tail = Keys("turn" + std::to_string(i) + "x", kBlocks);
    std::vector<std::vector<uint8_t>> v;
    for (size_t k = 0; k < kBlocks; ++k) v.push_back(Pattern(1000 * i + k, 1024));
    auto chain = prompt;
    chain.insert(chain.end(), tail.begin(), tail.end());
    EXPECT_EQ(ca.ExistsCount(chain), 2u);  // the prompt hits
    ca.Put(tail, v);
    tails.push_back(tail);
    vals.push_back(v);
  }
  const size_t total = 2 + kChains * kBlocks;
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return DramEntries(*a) + DramEntries(*sc.nodes[1]) + DramEntries(*sc.nodes[2]) == total;
  }));
  EXPECT_GT(a->Metric("kvpool_placement_chain_overfed_total"), 0);
  EXPECT_GT(DramEntries(*sc.nodes[1]) + DramEntries(*sc.nodes[2]), 0u);
  EXPECT_LT(DramEntries(*a), total);
  for (size_t i = 0; i < kChains; ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectValues(ca.Get(tails[i]), vals[i]));
  }
}

// The key homes remember keys no node holds any more (--directory-ghost): a
// writer whose exists call learns that a key it is about to put was dropped
// lately keeps it as a block coming back (protected), so new keys leave
// before it.
TEST(StaticClusterTest, AKeyDroppedLatelyIsKeptLongerWhenWrittenAgain) {
  StaticCluster sc;
  sc.PickPorts({"a", "b"});
  ASSERT_TRUE(sc.StartNodes({"a", "b"}, {"--dram-capacity", "16MiB", "--slab-size", "1MiB"}));
  NodeProcess* a = sc.nodes[0].get();
  Conn ca(*a);
  auto back = Keys("coming-back", 1), fresh = Keys("fresh", 1);
  std::vector<std::vector<uint8_t>> v64 = {Pattern(1, 64 << 10)};
  auto fill = [&](const std::string& name, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
      auto ids = Keys(name + std::to_string(i) + "-", 16);
      std::vector<std::vector<uint8_t>> vals;
      for (size_t k = 0; k < 16; ++k) vals.push_back(Pattern(100 + i + k, 64 << 10));
      ca.Put(ids, vals);
    }
  };
  ca.Put(back, v64);
  fill("first", 320);  // 16 MiB holds about 250 of 64 KiB: `back` is evicted
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    return ca.ExistsCount(back) == 0 && a->Metric("kvpool_remote_evicted_lately_total") >= 1;
  })) << a->Metric("kvpool_remote_evicted_lately_total");
  EXPECT_EQ(ca.ExistsCount(fresh), 0u);  // never stored: not evicted lately
  const double lately = a->Metric("kvpool_remote_evicted_lately_total");
  ca.Put(back, v64);
  ca.Put(fresh, v64);
  EXPECT_EQ(a->Metric("kvpool_remote_evicted_lately_total"), lately);
  fill("second", 320);  // evicts every key new since; `back` is protected
  EXPECT_EQ(ca.ExistsCount(back), 1u);
  EXPECT_EQ(ca.ExistsCount(fresh), 0u);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(ca.Get(back), v64));
}

TEST(StaticClusterTest, PeersListServesRemoteReads) {
  StaticCluster sc;
  sc.PickPorts({"a", "b"});
  ASSERT_TRUE(sc.ports[0] > 0 && sc.ports[1] > 0 && sc.ports[0] != sc.ports[1]);
  ASSERT_TRUE(sc.StartNodes({"a", "b"}));
  NodeProcess* a = sc.nodes[0].get();
  NodeProcess* b = sc.nodes[1].get();
  EXPECT_EQ(Members(*a).size(), 2u);
  Conn ca(*a), cb(*b);
  auto ids = Keys("static", 8);
  auto vals = Values(400, 8);
  ca.Put(ids, vals);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == ids.size(); }));
  auto got = cb.Get(ids);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
}

// A large batch get through b of values held on a (zero-copy client:
// acquire, copy out, release): every value arrives byte-exact, and each is
// fetched exactly once per read until b keeps it, its bytes counted once.
TEST(StaticClusterTest, LargeRemoteBatchGetFetchesEachValueOnce) {
  StaticCluster sc;
  sc.PickPorts({"a", "b"});
  ASSERT_TRUE(sc.StartNodes({"a", "b"}));
  NodeProcess* a = sc.nodes[0].get();
  NodeProcess* b = sc.nodes[1].get();
  Conn ca(*a), cb(*b, /*copy_mode=*/false);
  constexpr size_t kN = 24;
  auto ids = Keys("ahead", kN);
  ByteValues vals;
  for (size_t i = 0; i < kN; ++i) vals.push_back(Pattern(900 + i, (900 << 10) - i * 999));
  ca.Put(ids, vals);
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] { return cb.ExistsCount(ids) == kN; }));
  auto got = cb.Get(ids);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  EXPECT_EQ(b->Metric("kvpool_remote_fetches_total"), kN);
  uint64_t bytes = 0;
  for (const auto& v : vals) bytes += v.size();
  EXPECT_EQ(b->Metric("kvpool_remote_fetch_bytes_total"), static_cast<double>(bytes));
  // Read again: fetched again, and kept as local replicas this time
  // (--read-replicas repeat; b's 64 MiB holds them).
  got = cb.Get(ids);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  EXPECT_EQ(b->Metric("kvpool_remote_fetches_total"), 2 * kN);
  EXPECT_EQ(b->Metric("kvpool_remote_replicas_kept_total"), kN);
  // A third time: all local, nothing fetched.
  got = cb.Get(ids);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  EXPECT_EQ(b->Metric("kvpool_remote_fetches_total"), 2 * kN);
}

// Placement home with homes slower than the writer: a hand-off pins its
// value until the home has it (or its deadline passes), so without a bound
// the writer's DRAM fills with pinned values and refuses puts. Here the home
// b is stopped (SIGSTOP): every hand-off to it hangs to its deadline. With
// the in-flight budget every put still succeeds; what does not fit the
// budget waits in a queue (busy) and moves once b answers again.
TEST(StaticClusterTest, PlacementHomeWithAHungHomeNeverRefusesPuts) {
  StaticCluster sc;
  sc.PickPorts({"a", "b"});
  ASSERT_TRUE(sc.ports[0] > 0 && sc.ports[1] > 0 && sc.ports[0] != sc.ports[1]);
  ASSERT_TRUE(sc.StartNodes({"a", "b"}, {"--placement", "home", "--dram-capacity", "64MiB",
                                         "--slab-size", "1MiB", "--peer-fetch-timeout", "2s"}));
  NodeProcess* a = sc.nodes[0].get();
  NodeProcess* b = sc.nodes[1].get();
  kvpool_client* c = OpenLocal(*a, /*copy_mode=*/true);
  ASSERT_NE(c, nullptr);
  const size_t kN = 512, kBatch = 16;  // 128 MiB of 256 KiB values, twice a's DRAM
  auto ids = NumberedKeys("cluster-it", "busy-", kN);
  auto put_all = [&](size_t from, size_t to) {
    size_t refused = 0;
    for (size_t i = from; i < to; i += kBatch) {
      std::vector<kvpool_key_id> bid(ids.begin() + i, ids.begin() + i + kBatch);
      ByteValues bval;
      for (size_t k = i; k < i + kBatch; ++k) bval.push_back(Pattern(900000 + k, 256 << 10));
      std::vector<kvpool_status> st(kBatch, KVPOOL_INTERNAL);
      EXPECT_EQ(PutValues(c, bid, bval, &st), KVPOOL_OK) << kvpool_last_error();
      for (kvpool_status x : st) refused += x != KVPOOL_OK;
    }
    return refused;
  };
  EXPECT_EQ(put_all(0, 64), 0u);  // b up: values move
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return a->Metric("kvpool_placement_moved_total") > 0; }));
  ASSERT_EQ(kill(b->pid(), SIGSTOP), 0);
  EXPECT_EQ(put_all(64, kN), 0u) << "puts must not be refused while the home hangs";
  double busy = a->Metric("kvpool_placement_busy_total");
  double inflight = a->Metric("kvpool_placement_inflight_bytes");
  ASSERT_EQ(kill(b->pid(), SIGCONT), 0);
  kvpool_close(c);
  EXPECT_TRUE(WaitFor(milliseconds(8000), [&] {
    return a->Metric("kvpool_placement_inflight_bytes") == 0 &&
           a->Metric("kvpool_placement_queued") == 0;
  }));
  double moved = a->Metric("kvpool_placement_moved_total");
  double kept = a->Metric("kvpool_placement_kept_total");
  std::printf("placement with a hung home: moved %.0f busy %.0f kept %.0f of %zu, "
              "%.0f bytes in flight while hung\n", moved, busy, kept, kN, inflight);
  EXPECT_GT(busy, 0);
  EXPECT_GT(inflight, 0);
  EXPECT_LE(inflight, 16.0 * (1 << 20));  // a quarter of a's DRAM
  EXPECT_LE(moved + kept, static_cast<double>(kN));
  EXPECT_EQ(a->Metric("kvpool_placement_queue_full_total"), 0);
  // Queued values moved once b answered (those a evicted meanwhile are gone).
  EXPECT_GT(moved, 64);
}

TEST(StaticClusterTest, ANodeStoppedWithHandOffsInFlightExitsCleanly) {
  // Stopping a node fails its calls in flight; their callbacks run while the
  // node shuts down and must find the cluster still whole.
  StaticCluster sc;
  sc.PickPorts({"a", "b"});
  ASSERT_TRUE(sc.ports[0] > 0 && sc.ports[1] > 0 && sc.ports[0] != sc.ports[1]);
  ASSERT_TRUE(sc.StartNodes({"a", "b"}, {"--placement", "home", "--dram-capacity", "64MiB",
                                         "--slab-size", "1MiB", "--peer-fetch-timeout", "30s"}));
  NodeProcess* a = sc.nodes[0].get();
  NodeProcess* b = sc.nodes[1].get();
  kvpool_client* c = OpenLocal(*a, /*copy_mode=*/true);
  ASSERT_NE(c, nullptr);
  const size_t kN = 128, kBatch = 16;
  auto ids = NumberedKeys("cluster-it", "stop-", kN);
  ASSERT_EQ(kill(b->pid(), SIGSTOP), 0);  // b hangs: a's hand-offs stay in flight
  for (size_t i = 0; i < kN; i += kBatch) {
    std::vector<kvpool_key_id> bid(ids.begin() + i, ids.begin() + i + kBatch);
    ByteValues bval;
    for (size_t k = i; k < i + kBatch; ++k) bval.push_back(Pattern(910000 + k, 256 << 10));
    std::vector<kvpool_status> st(kBatch, KVPOOL_INTERNAL);
    ASSERT_EQ(PutValues(c, bid, bval, &st), KVPOOL_OK) << kvpool_last_error();
  }
  kvpool_close(c);
  ASSERT_GT(a->Metric("kvpool_placement_inflight_bytes"), 0);
  ASSERT_GT(a->Metric("kvpool_placement_queued"), 0);
  const int status = a->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "status " << status << (WIFSIGNALED(status) ? " (signal " : " (exit ")
      << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)) << ")\n"
      << a->Log();
  ASSERT_EQ(kill(b->pid(), SIGCONT), 0);
}

TEST(StandaloneNodeTest, MembersListsOnlyItself) {
  auto n = NodeProcess::Start();
  ASSERT_NE(n, nullptr);
  auto m = Members(*n);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m.begin()->first, "test-node");
}

TEST(NodeOptionsTest, NonLoopbackPeerAddressNeedsAClusterKeyOrInsecure) {
  std::string out;
  int rc = RunCommand({"/usr/bin/timeout", "20", NodeBinary(), "--peers", "a=10.0.0.1:7000",
                           "--node-id", "a", "--peer-port", "7000", "--peer-address", "0.0.0.0",
                           "--admin-port", "0"},
                          &out, /*merge_stderr=*/true);
  EXPECT_EQ(rc, 1) << out;  // refused at start, before anything binds
  EXPECT_NE(out.find("--cluster-key-file"), std::string::npos) << out;
  EXPECT_NE(out.find("--insecure"), std::string::npos) << out;
}

// Loopback too: a peer port on a multi-user host serves any local user, so
// it needs the cluster key or --insecure; the error says how to make a key.
TEST(NodeOptionsTest, ALoopbackPeerPortNeedsAClusterKeyOrInsecure) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  char tmpl[] = "/tmp/kvpool-loopback-key-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> base = {"/usr/bin/timeout", "20", NodeBinary(), "--peers",
                                         "a=127.0.0.1:" + std::to_string(port), "--node-id", "a",
                                         "--peer-port", std::to_string(port), "--admin-port", "0",
                                         "--socket", dir + "/node.sock"};
  std::string out;
  EXPECT_EQ(RunCommand(base, &out, /*merge_stderr=*/true), 1) << out;
  EXPECT_NE(out.find("needs the cluster key, loopback included"), std::string::npos) << out;
  EXPECT_NE(out.find("openssl rand -hex 32"), std::string::npos) << out;
  EXPECT_NE(out.find("--insecure"), std::string::npos) << out;
  // --insecure starts it (stopped by timeout's SIGTERM: exit 0 after 2 s).
  std::vector<std::string> insecure = base;
  insecure[1] = "2";
  insecure.push_back("--insecure");
  EXPECT_EQ(RunCommand(insecure, &out, /*merge_stderr=*/true), 124) << out;
  EXPECT_NE(out.find("serving"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvpool::testing
