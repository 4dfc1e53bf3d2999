// Cluster fault tests: real kvpool-node processes over a real etcd, under a
// byte-verified client load. kill -9 of a node mid-load, etcd hanging under
// load, one node cut from etcd (through a TCP proxy this test controls) but
// not from its peers, and placement home spreading values over the homes.
// Each test prints one summary line ("SUMMARY {...}") for the record.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/cluster_harness.h"
#include "harness/load.h"
#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "membership/etcd_test_util.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// ---- A tiny TCP forwarding proxy (the cut between one node and etcd). -----

class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    lfd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd_, 64) != 0 ||
        getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~TcpProxy() {
    stop_ = true;
    shutdown(lfd_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    close(lfd_);
    std::vector<std::thread> pumps;
    {
      std::lock_guard<std::mutex> l(mu_);
      pumps.swap(pumps_);
    }
    for (auto& t : pumps) t.join();
  }
  int port() const { return port_; }
  // Cut: live connections are closed, new ones are accepted and closed.
  void Cut() { cut_ = true; }
  void Restore() { cut_ = false; }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{lfd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int c = accept(lfd_, nullptr, nullptr);
      if (c < 0) continue;
      if (cut_) {
        close(c);
        continue;
      }
      int u = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(u, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(u);
        close(c);
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      pumps_.emplace_back([this, c, u] { Pump(c, u); });
    }
  }
  void Pump(int a, int b) {
    char buf[16384];
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    while (!stop_ && !cut_) {
      if (poll(p, 2, 20) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        ssize_t n = read(p[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          done = true;
          break;
        }
        int out = p[1 - i].fd;
        for (ssize_t off = 0; off < n;) {
          ssize_t w = write(out, buf + off, n - off);
          if (w <= 0) {
            done = true;
            break;
          }
          off += w;
        }
      }
      if (done) break;
    }
    shutdown(a, SHUT_RDWR);
    shutdown(b, SHUT_RDWR);
    close(a);
    close(b);
  }

  int target_port_;
  int lfd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, cut_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
};

int PortOf(const std::string& url) { return std::stoi(url.substr(url.rfind(':') + 1)); }

class ClusterFaultTest : public EtcdClusterTest {
 protected:
  ClusterFaultTest() : EtcdClusterTest("ft") {}
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    EtcdClusterTest::SetUp();
  }


 public:  // also for the scenario helpers outside the fixture
  std::unique_ptr<NodeProcess> StartNode(const std::vector<std::string>& args) {
    return StartNodeWith(args);
  }
  std::vector<std::string> NodeArgs(const std::string& id) const { return Args(id); }
};

// 1. kill -9 of one node under load.
TEST_F(ClusterFaultTest, KillNineUnderLoadLosesOnlyTheVictimsKeys) {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* id : {"a", "b", "c"}) {
    nodes.push_back(StartNode(Args(id)));
    ASSERT_NE(nodes.back(), nullptr);
  }
  for (auto& n : nodes) ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  NodeProcess &a = *nodes[0], &b = *nodes[1], &c = *nodes[2];
  uint64_t old_inc = Members(a)["c"];

  // Keys held by the victim (written through its socket).
  auto victim_keys = MakeKeys("victim-", 2, 64, 9000000, 1024, 8192);
  {
    Conn cc(c);
    ASSERT_EQ(cc.Put(victim_keys), victim_keys.size());
  }

  Registry reg;
  LoadStats s;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads = StartLoad(nodes, {0, 1}, 2, &reg, &s, &stop, 400);
  // Victim keys read from the survivors while the victim lives and after.
  std::atomic<uint64_t> victim_hits{0}, victim_misses{0}, victim_wrong{0};
  std::thread victim_reader([&] {
    Conn ca(a);
    std::mt19937_64 rng(7);
    while (!stop) {
      std::vector<KeyRec> ks;
      for (int i = 0; i < 2; ++i) ks.push_back(victim_keys[rng() % victim_keys.size()]);
      std::vector<bool> hit;
      uint64_t wrong = 0;
      auto t0 = steady_clock::now();
      ca.Get(ks, &hit, &wrong);
      double ms = std::chrono::duration<double, std::milli>(steady_clock::now() - t0).count();
      if (ms > 3000) s.ops_over_3s++;
      victim_wrong += wrong;
      for (bool h : hit) (h ? victim_hits : victim_misses)++;
      // Sleeps: real nodes: load paced through the fault.
      std::this_thread::sleep_for(milliseconds(20));
    }
  });

  // Load before the fault: an amount of it (about 1.5 s here), not a time.
  auto victim_reads = [&] { return victim_hits.load() + victim_misses.load(); };
  ASSERT_TRUE(WaitFor(milliseconds(20000), [&] { return s.ops >= 2000 && victim_reads() >= 100; }));
  uint64_t ops_before_kill = s.ops;
  auto killed = steady_clock::now();
  c.Stop(SIGKILL);
  // Lease TTL 2 s: out of every survivor's view within TTL + 2 s.
  bool left = WaitFor(milliseconds(4000), [&] {
    return Members(a).count("c") == 0 && Members(b).count("c") == 0;
  }, milliseconds(20));
  int64_t t_membership_update_ms = MsSince(killed);
  EXPECT_TRUE(left) << a.HttpGet("/api/v1/members");
  EXPECT_LE(t_membership_update_ms, 4100);
  // And as much load after it.
  const uint64_t ops_at_leave = s.ops, victim_reads_at_leave = victim_reads();
  EXPECT_TRUE(WaitFor(milliseconds(20000), [&] {
    return s.ops >= ops_at_leave + 2000 && victim_reads() >= victim_reads_at_leave + 100;
  }));
  stop = true;
  for (auto& t : threads) t.join();
  victim_reader.join();

  // Every key written through a survivor, read through the other survivor
  // (remote) and its own (local): bounded wait for republishing to new homes.
  auto all = reg.All();
  std::vector<KeyRec> of_a, of_b;
  for (const auto& k : all) (k.holder == 0 ? of_a : of_b).push_back(k);
  Conn ca(a), cb(b);
  uint64_t sweep_wrong = 0;
  size_t local_hits = HitCount(ca, of_a, &sweep_wrong) + HitCount(cb, of_b, &sweep_wrong);
  size_t cross_hits = 0;
  std::vector<KeyRec> pending_a = of_a, pending_b = of_b;  // a's keys read via b, b's via a
  WaitFor(milliseconds(4000), [&] {
    std::vector<KeyRec> miss_a, miss_b;
    cross_hits += HitCount(cb, pending_a, &sweep_wrong, &miss_a);
    cross_hits += HitCount(ca, pending_b, &sweep_wrong, &miss_b);
    pending_a.swap(miss_a);
    pending_b.swap(miss_b);
    return pending_a.empty() && pending_b.empty();
  }, milliseconds(200));
  double cross_ratio = all.empty() ? 0 : double(cross_hits) / all.size();

  auto rejoin_t0 = steady_clock::now();
  auto c2 = StartNode(Args("c"));
  ASSERT_NE(c2, nullptr);
  bool back = WaitFor(milliseconds(5000), [&] {
    auto ma = Members(a), mb = Members(b);
    return ma.count("c") && mb.count("c") && ma["c"] > old_inc && mb["c"] > old_inc;
  });
  int64_t t_rejoin_ms = MsSince(rejoin_t0);
  uint64_t new_inc = Members(a)["c"];

  std::printf(
      "SUMMARY {\"test\":\"kill9_under_load\",\"ops\":%llu,\"ops_before_kill\":%llu,\"gets\":%llu,"
      "\"hits\":%llu,\"misses\":%llu,\"local_misses\":%llu,\"remote_hits\":%llu,"
      "\"remote_misses\":%llu,\"victim_hits\":%llu,\"victim_misses\":%llu,\"wrong_bytes\":%llu,"
      "\"ops_over_3s\":%llu,\"p99_ms\":%.2f,\"max_ms\":%.2f,\"t_membership_update_ms\":%lld,"
      "\"survivor_keys\":%zu,\"sweep_local_hits\":%zu,\"sweep_cross_hits\":%zu,"
      "\"sweep_cross_ratio\":%.4f,\"t_rejoin_ms\":%lld,\"incarnation\":\"%llu->%llu\"}\n",
      (unsigned long long)s.ops, (unsigned long long)ops_before_kill, (unsigned long long)s.gets,
      (unsigned long long)s.hits, (unsigned long long)s.misses,
      (unsigned long long)s.local_misses, (unsigned long long)s.remote_hits,
      (unsigned long long)s.remote_misses, (unsigned long long)victim_hits,
      (unsigned long long)victim_misses,
      (unsigned long long)(s.wrong_bytes + victim_wrong + sweep_wrong),
      (unsigned long long)s.ops_over_3s, s.P99(), s.MaxMs(), (long long)t_membership_update_ms,
      all.size(), local_hits, cross_hits, cross_ratio, (long long)t_rejoin_ms,
      (unsigned long long)old_inc, (unsigned long long)new_inc);

  EXPECT_GT(ops_before_kill, 0u);
  EXPECT_GT(s.ops, ops_before_kill);
  EXPECT_EQ(s.wrong_bytes + victim_wrong + sweep_wrong, 0u);
  EXPECT_EQ(s.ops_over_3s, 0u);
  EXPECT_EQ(s.call_errors, 0u);
  EXPECT_EQ(s.put_failed, 0u);
  EXPECT_EQ(s.local_misses, 0u);  // a survivor's own keys never miss locally
  EXPECT_GT(s.remote_hits, 0u);
  EXPECT_EQ(local_hits, all.size());
  EXPECT_GE(cross_ratio, 0.99) << "survivor keys read through the other survivor";
  EXPECT_TRUE(back) << a.HttpGet("/api/v1/members");
  EXPECT_GT(new_inc, old_inc);
}

// 2. etcd down under load. A node whose lease renewals fail asks its peers
// before fencing; when they cannot renew either, etcd is down for everyone
// and every node keeps serving with its last view: local AND peer reads go
// on, nobody fences. Two ways etcd goes away:
//  - stopped for 30 s, then started again on its data directory: etcd
//    refreshes the leases when it takes leadership again, so no node is
//    expelled (the incarnations do not change);
//  - hung (SIGSTOP) for 10 s: the process keeps its clock, so on SIGCONT it
//    expires the leases it could not see renewed; every node then fences
//    on "lease expired", registers again under a new incarnation and
//    replays its inventory. Reads must come back within a bounded wait.
struct OutageRun {
  LoadStats s;
  uint64_t outage_ms = 0;
  int64_t t_outage_ms[3] = {-1, -1, -1};  // first "etcd_outage" seen, per node
  bool fenced_in_outage = false;
  std::string ctl_in_outage;           // kvpoolctl members mid-outage
  bool status_says_outage = false;     // /api/v1/status membership.etcd_outage mid-outage
  uint64_t probe_hits[3] = {0, 0, 0}, probe_misses[3] = {0, 0, 0}, probe_wrong = 0;
  bool recovered = false;
  int64_t t_membership_update_ms = -1;
  std::map<std::string, uint64_t> inc_before, inc_after;
  uint64_t remote_after = 0;
  double publish_retried = 0, publish_dropped = 0;  // summed over the nodes, at the end
};

void RunEtcdOutage(ClusterFaultTest* t, EtcdTestServer* etcd, bool hang, milliseconds outage,
                   OutageRun* r) {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* id : {"a", "b", "c"}) {
    nodes.push_back(t->StartNode(t->NodeArgs(id)));
    ASSERT_NE(nodes.back(), nullptr);
  }
  for (auto& n : nodes) ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  r->inc_before = Members(*nodes[0]);

  // Probe keys: per node, never read before; each probe reads fresh keys of
  // the next node (a remote read that cannot be served from a replica), two
  // per node every 100 ms through the whole run.
  const size_t probe_keys = static_cast<size_t>(outage.count() / 1000 + 15) * 20 + 40;
  std::vector<std::vector<KeyRec>> probe(3);
  for (int i = 0; i < 3; ++i) {
    probe[i] = MakeKeys("probe-" + std::to_string(i) + "-", i, probe_keys, 8000000 + 10000 * i,
                        1024, 4096);
    Conn conn(*nodes[i]);
    ASSERT_EQ(conn.Put(probe[i]), probe[i].size());
  }
  {
    Conn ca(*nodes[0]);
    ASSERT_TRUE(WaitFor(milliseconds(3000), [&] {
      return ca.ExistsCount(probe[1]) == probe[1].size() && ca.ExistsCount(probe[2]) == probe[2].size();
    }));
  }

  Registry reg;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads = StartLoad(nodes, {0, 1, 2}, 1, &reg, &r->s, &stop, 300);
  // phase: 0 before the outage, 1 during it, 2 after etcd is back.
  std::atomic<int> phase{0};
  std::atomic<uint64_t> hits[3] = {0, 0, 0}, misses[3] = {0, 0, 0}, wrong{0};
  std::thread prober([&] {
    std::vector<std::unique_ptr<Conn>> conns;
    for (auto& n : nodes) conns.push_back(std::make_unique<Conn>(*n));
    size_t next[3] = {0, 0, 0};
    while (!stop) {
      int ph = phase;
      for (int i = 0; i < 3; ++i) {
        auto& keys = probe[(i + 1) % 3];
        if (next[i] + 2 + 40 > keys.size()) continue;  // the last 40 are read at the end
        std::vector<KeyRec> ks(keys.begin() + next[i], keys.begin() + next[i] + 2);
        next[i] += 2;
        std::vector<bool> hit;
        uint64_t w = 0;
        auto t0 = steady_clock::now();
        conns[i]->Get(ks, &hit, &w);
        if (MsSince(t0) > 3000) r->s.ops_over_3s++;
        wrong += w;
        for (bool h : hit) (h ? hits[ph] : misses[ph])++;
      }
      // Sleeps: real nodes: load paced through the fault.
      std::this_thread::sleep_for(milliseconds(100));
    }
  });

  // Load before the fault: an amount of it (15 rounds of probes, about
  // 1.5 s), not a time.
  auto probed = [&](int ph) { return hits[ph].load() + misses[ph].load(); };
  ASSERT_TRUE(WaitFor(milliseconds(20000), [&] { return probed(0) >= 90 && r->s.ops >= 1000; }));
  uint64_t local_misses_before = r->s.local_misses;
  auto outage_t0 = steady_clock::now();
  phase = 1;
  if (hang) {
    etcd->Pause();
  } else {
    etcd->Stop();
  }
  while (steady_clock::now() - outage_t0 < outage) {
    for (int i = 0; i < 3; ++i) {
      if (r->t_outage_ms[i] < 0 && EtcdOutage(*nodes[i])) r->t_outage_ms[i] = MsSince(outage_t0);
      r->fenced_in_outage = r->fenced_in_outage || Fenced(*nodes[i]);
    }
    if (r->ctl_in_outage.empty() && steady_clock::now() - outage_t0 > outage / 2) {
      std::string admin = "127.0.0.1:" + std::to_string(nodes[1]->admin_port());
      RunCommand({CtlBinary(), "members", "--admin", admin}, &r->ctl_in_outage);
      auto st = nlohmann::json::parse(nodes[1]->HttpGet("/api/v1/status"), nullptr, false);
      r->status_says_outage = st.is_object() && st["membership"].value("etcd_outage", false);
    }
    // Sleeps: real etcd down: the status is sampled.
    std::this_thread::sleep_for(milliseconds(100));
  }
  uint64_t local_misses_outage = r->s.local_misses - local_misses_before;
  r->outage_ms = MsSince(outage_t0);
  phase = 2;
  if (hang) {
    etcd->Resume();
  } else {
    ASSERT_TRUE(etcd->Relaunch().ok());
  }
  auto back = steady_clock::now();
  // Every node in every view, unfenced, out of the outage.
  r->recovered = WaitFor(milliseconds(10000), [&] {
    for (auto& n : nodes) {
      auto m = Members(*n);
      if (m.size() != 3 || Fenced(*n) || EtcdOutage(*n)) return false;
      for (auto& o : nodes) {
        if (Members(*o) != m) return false;  // all views agree
      }
    }
    return true;
  });
  r->t_membership_update_ms = MsSince(back);
  r->inc_after = Members(*nodes[0]);
  // Load after it: 20 rounds of probes (about 2 s).
  const uint64_t probed_back = probed(2), ops_back = r->s.ops;
  EXPECT_TRUE(WaitFor(milliseconds(20000), [&] {
    return probed(2) >= probed_back + 120 && r->s.ops >= ops_back + 1000;
  }));
  stop = true;
  for (auto& th : threads) th.join();
  prober.join();
  // Remote reads work again: fresh keys of b, read through a (bounded wait
  // for the replay under new incarnations after a hang).
  uint64_t remote_after_wrong = 0;
  {
    std::vector<KeyRec> rest(probe[1].end() - 40, probe[1].end());
    Conn ca(*nodes[0]);
    WaitFor(milliseconds(5000), [&] {
      r->remote_after = HitCount(ca, rest, &remote_after_wrong);
      return r->remote_after == rest.size();
    }, milliseconds(200));
  }
  for (int i = 0; i < 3; ++i) {
    r->probe_hits[i] = hits[i];
    r->probe_misses[i] = misses[i];
    r->publish_retried += nodes[i]->Metric("kvpool_publish_retried_total");
    r->publish_dropped += nodes[i]->Metric("kvpool_publish_dropped_total");
  }
  r->probe_wrong = wrong + remote_after_wrong;
  auto inc = [&](const std::map<std::string, uint64_t>& m, const char* id) {
    auto it = m.find(id);
    return (unsigned long long)(it == m.end() ? 0 : it->second);
  };
  std::printf(
      "SUMMARY {\"test\":\"etcd_%s_under_load\",\"outage_ms\":%llu,\"ops\":%llu,\"gets\":%llu,"
      "\"hits\":%llu,\"misses\":%llu,\"local_misses\":%llu,\"local_misses_in_outage\":%llu,"
      "\"wrong_bytes\":%llu,\"ops_over_3s\":%llu,\"p99_ms\":%.2f,\"max_ms\":%.2f,"
      "\"t_outage_ms\":[%lld,%lld,%lld],\"fenced_in_outage\":%d,"
      "\"fresh_remote_before\":\"%llu/%llu\",\"fresh_remote_in_outage\":\"%llu/%llu\","
      "\"fresh_remote_after\":\"%llu/%llu\",\"t_membership_update_ms\":%lld,"
      "\"remote_after_final\":%llu,\"publish_retried\":%.0f,\"publish_dropped\":%.0f,"
      "\"incarnations\":\"a %llu->%llu b %llu->%llu c %llu->%llu\"}\n",
      hang ? "hung" : "stopped", (unsigned long long)r->outage_ms, (unsigned long long)r->s.ops,
      (unsigned long long)r->s.gets, (unsigned long long)r->s.hits,
      (unsigned long long)r->s.misses, (unsigned long long)r->s.local_misses,
      (unsigned long long)local_misses_outage,
      (unsigned long long)(r->s.wrong_bytes + r->probe_wrong),
      (unsigned long long)r->s.ops_over_3s, r->s.P99(), r->s.MaxMs(),
      (long long)r->t_outage_ms[0], (long long)r->t_outage_ms[1], (long long)r->t_outage_ms[2],
      r->fenced_in_outage ? 1 : 0, (unsigned long long)r->probe_hits[0],
      (unsigned long long)(r->probe_hits[0] + r->probe_misses[0]),
      (unsigned long long)r->probe_hits[1],
      (unsigned long long)(r->probe_hits[1] + r->probe_misses[1]),
      (unsigned long long)r->probe_hits[2],
      (unsigned long long)(r->probe_hits[2] + r->probe_misses[2]),
      (long long)r->t_membership_update_ms, (unsigned long long)r->remote_after,
      r->publish_retried, r->publish_dropped, inc(r->inc_before, "a"), inc(r->inc_after, "a"), inc(r->inc_before, "b"),
      inc(r->inc_after, "b"), inc(r->inc_before, "c"), inc(r->inc_after, "c"));
}

// What both outages must show while etcd is away.
void ExpectServedThroughTheOutage(const OutageRun& r, milliseconds outage) {
  EXPECT_EQ(r.s.wrong_bytes + r.probe_wrong, 0u);
  EXPECT_EQ(r.s.ops_over_3s, 0u);
  EXPECT_EQ(r.s.call_errors, 0u);
  EXPECT_EQ(r.s.put_failed, 0u);
  EXPECT_EQ(r.s.local_misses, 0u) << "local reads must hit through the whole outage";
  EXPECT_GT(r.s.remote_hits, 0u);
  EXPECT_GE(r.outage_ms, static_cast<uint64_t>(outage.count()));
  // Every node notices within TTL/2 + 1 s and none fences.
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(r.t_outage_ms[i], 0) << i;
    EXPECT_LE(r.t_outage_ms[i], 2000) << i;
  }
  EXPECT_FALSE(r.fenced_in_outage);
  EXPECT_NE(r.ctl_in_outage.find("etcd is unreachable"), std::string::npos) << r.ctl_in_outage;
  EXPECT_TRUE(r.status_says_outage);
  // Peer reads of fresh keys hit before and all through the outage.
  EXPECT_GT(r.probe_hits[0], 0u);
  EXPECT_EQ(r.probe_misses[0], 0u);
  EXPECT_GE(r.probe_hits[1], static_cast<uint64_t>(outage.count() / 100));
  EXPECT_EQ(r.probe_misses[1], 0u) << "peer reads must hit through the whole outage";
  EXPECT_TRUE(r.recovered);
  EXPECT_LE(r.t_membership_update_ms, 10000);
  EXPECT_EQ(r.inc_after.size(), 3u);
  EXPECT_EQ(r.remote_after, 40u);
}

TEST_F(ClusterFaultTest, EtcdStoppedThirtySecondsLocalAndPeerReadsContinueNoNodeExpelled) {
  const milliseconds kOutage{30000};
  OutageRun r;
  ASSERT_NO_FATAL_FAILURE(RunEtcdOutage(this, etcd_.get(), /*hang=*/false, kOutage, &r));
  ExpectServedThroughTheOutage(r, kOutage);
  // etcd refreshed the leases when it took leadership again: nobody left.
  EXPECT_EQ(r.inc_after, r.inc_before);
}

TEST_F(ClusterFaultTest, EtcdHungUnderLoadLocalAndPeerReadsContinue) {
  const milliseconds kOutage{10000};
  OutageRun r;
  ASSERT_NO_FATAL_FAILURE(RunEtcdOutage(this, etcd_.get(), /*hang=*/true, kOutage, &r));
  ExpectServedThroughTheOutage(r, kOutage);
}

// 3. One node cut from etcd (not from its peers) fences itself.
TEST_F(ClusterFaultTest, NodeCutFromEtcdOnlyFencesItselfAndComesBack) {
  TcpProxy proxy(PortOf(etcd_->endpoint()));
  ASSERT_GT(proxy.port(), 0);
  auto a = StartNode(Args("a")), b = StartNode(Args("b"));
  auto c = StartNode(Args("c", "http://127.0.0.1:" + std::to_string(proxy.port())));
  ASSERT_TRUE(a && b && c);
  for (NodeProcess* n : {a.get(), b.get(), c.get()}) {
    ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  }
  uint64_t old_inc = Members(*a)["c"];
  auto r1 = MakeKeys("cut-r1-", 0, 32, 7000000, 1024, 8192);  // on a, read via c before the cut
  auto r2 = MakeKeys("cut-r2-", 0, 32, 7100000, 1024, 8192);  // on a, read via c during the cut
  auto lc = MakeKeys("cut-lc-", 2, 32, 7200000, 1024, 8192);  // on c
  Conn ca(*a), cb(*b), cc(*c);
  ASSERT_EQ(ca.Put(r1), r1.size());
  ASSERT_EQ(ca.Put(r2), r2.size());
  ASSERT_EQ(cc.Put(lc), lc.size());
  ASSERT_TRUE(WaitFor(milliseconds(3000), [&] {
    return cb.ExistsCount(r1) == r1.size() && cb.ExistsCount(r2) == r2.size();
  }));
  uint64_t wrong = 0;
  size_t r1_hits = HitCount(cc, r1, &wrong);
  EXPECT_EQ(r1_hits, r1.size());

  auto cut = steady_clock::now();
  proxy.Cut();
  bool fenced = WaitFor(milliseconds(3000), [&] { return Fenced(*c); }, milliseconds(20));
  int64_t t_fenced_ms = MsSince(cut);
  double fenced_metric = c->Metric("kvpool_membership_fenced");
  auto t0 = steady_clock::now();
  size_t r2_hits_cut = HitCount(cc, r2, &wrong);
  int64_t r2_ms = MsSince(t0);
  size_t lc_hits_cut = HitCount(cc, lc, &wrong);
  // Hold the cut past the TTL: the others drop c (its lease expires) but
  // never fence themselves.
  bool others_fenced = false;
  bool c_left = WaitFor(milliseconds(5000), [&] {
    others_fenced = others_fenced || Fenced(*a) || Fenced(*b);
    return Members(*a).count("c") == 0 && Members(*b).count("c") == 0;
  });
  int64_t t_c_left_ms = MsSince(cut);
  others_fenced = others_fenced || Fenced(*a) || Fenced(*b);
  double a_metric = a->Metric("kvpool_membership_fenced");

  auto restored = steady_clock::now();
  proxy.Restore();
  bool back = WaitFor(milliseconds(8000), [&] {
    auto ma = Members(*a), mb = Members(*b);
    return !Fenced(*c) && ma.count("c") && mb.count("c") && ma["c"] > old_inc && mb["c"] > old_inc;
  });
  int64_t t_rejoin_ms = MsSince(restored);
  uint64_t new_inc = Members(*a)["c"];
  size_t r2_hits_after = 0;
  WaitFor(milliseconds(5000), [&] {
    r2_hits_after = HitCount(cc, r2, &wrong);
    return r2_hits_after == r2.size();
  }, milliseconds(200));

  std::printf(
      "SUMMARY {\"test\":\"cut_from_etcd\",\"t_fenced_ms\":%lld,\"fenced_metric\":%.0f,"
      "\"remote_hits_before\":\"%zu/%zu\",\"remote_hits_cut\":\"%zu/%zu\",\"remote_cut_ms\":%lld,"
      "\"local_hits_cut\":\"%zu/%zu\",\"others_fenced\":%d,\"t_membership_update_ms\":%lld,"
      "\"t_rejoin_ms\":%lld,\"remote_hits_after\":\"%zu/%zu\",\"wrong_bytes\":%llu,"
      "\"incarnation\":\"%llu->%llu\"}\n",
      (long long)t_fenced_ms, fenced_metric, r1_hits, r1.size(), r2_hits_cut, r2.size(),
      (long long)r2_ms, lc_hits_cut, lc.size(), others_fenced ? 1 : 0, (long long)t_c_left_ms,
      (long long)t_rejoin_ms, r2_hits_after, r2.size(), (unsigned long long)wrong,
      (unsigned long long)old_inc, (unsigned long long)new_inc);

  EXPECT_TRUE(fenced);
  EXPECT_LE(t_fenced_ms, 2000);  // TTL/2 + 1 s
  EXPECT_EQ(fenced_metric, 1);
  EXPECT_EQ(r2_hits_cut, 0u) << "a fenced node does no remote reads";
  EXPECT_EQ(lc_hits_cut, lc.size()) << "local reads keep hitting while fenced";
  EXPECT_FALSE(others_fenced);
  EXPECT_EQ(a_metric, 0);
  EXPECT_TRUE(c_left);
  EXPECT_TRUE(back) << a->HttpGet("/api/v1/members") << c->HttpGet("/api/v1/members");
  EXPECT_GT(new_inc, old_inc);
  EXPECT_EQ(r2_hits_after, r2.size());
  EXPECT_EQ(wrong, 0u);
}

// 4. Placement home spreads values over the homes in proportion to the
// shards each owns.
TEST_F(ClusterFaultTest, PlacementHomeSpreadsThousandsOfValuesEvenly) {
  const size_t kN = 3000;
  const uint32_t kSize = 64 * 1024;
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* id : {"a", "b", "c"}) {
    auto args = Args(id);
    args.insert(args.end(), {"--placement", "home", "--dram-capacity", "512MiB"});
    nodes.push_back(StartNode(args));
    ASSERT_NE(nodes.back(), nullptr);
  }
  for (auto& n : nodes) ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return Members(*n).size() == 3; }));
  auto keys = MakeKeys("home-", 0, kN, 6000000, kSize, 0);
  auto t0 = steady_clock::now();
  {
    Conn ca(*nodes[0]);
    for (size_t i = 0; i < kN; i += 32) {
      std::vector<KeyRec> batch(keys.begin() + i, keys.begin() + std::min(kN, i + 32));
      ASSERT_EQ(ca.Put(batch), batch.size()) << i;
    }
  }
  int64_t put_ms = MsSince(t0);
  // Settled: every value in exactly one place, everything not kept by a
  // moved, and the same for 5 polls in a row (hand-offs still in flight
  // count on the writer, so one matching poll is not enough).
  std::vector<uint64_t> entries(3);
  std::vector<uint64_t> last;
  int stable = 0;
  bool settled = WaitFor(milliseconds(10000), [&] {
    for (int i = 0; i < 3; ++i) entries[i] = DramEntries(*nodes[i]);
    double moved = nodes[0]->Metric("kvpool_placement_moved_total");
    std::vector<uint64_t> now = {entries[0], entries[1], entries[2], uint64_t(moved)};
    bool ok = entries[0] + entries[1] + entries[2] == kN &&
              moved == static_cast<double>(entries[1] + entries[2]);
    stable = (ok && now == last) ? stable + 1 : 0;
    last = now;
    return stable >= 5;
  }, milliseconds(100));
  auto mj = MembersJson(*nodes[0]);
  ASSERT_TRUE(mj.is_object());
  uint64_t total = mj["shards"]["total"].get<uint64_t>();
  std::vector<double> expected(3);
  const char* ids[3] = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    expected[i] = double(kN) * mj["shards"]["owned"].value(ids[i], 0) / double(total);
  }
  std::vector<size_t> hits(3);
  uint64_t wrong = 0;
  auto r0 = steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    Conn conn(*nodes[i]);
    hits[i] = HitCount(conn, keys, &wrong);
  }
  int64_t read_ms = MsSince(r0);

  std::printf(
      "SUMMARY {\"test\":\"placement_home_spread\",\"n\":%zu,\"value_bytes\":%u,\"put_ms\":%lld,"
      "\"entries\":[%llu,%llu,%llu],\"expected\":[%.1f,%.1f,%.1f],\"moved\":%.0f,"
      "\"hits\":[%zu,%zu,%zu],\"misses\":%zu,\"wrong_bytes\":%llu,\"read_all_ms\":%lld}\n",
      kN, kSize, (long long)put_ms, (unsigned long long)entries[0], (unsigned long long)entries[1],
      (unsigned long long)entries[2], expected[0], expected[1], expected[2],
      nodes[0]->Metric("kvpool_placement_moved_total"), hits[0], hits[1], hits[2],
      3 * kN - hits[0] - hits[1] - hits[2], (unsigned long long)wrong, (long long)read_ms);

  EXPECT_TRUE(settled);
  if (!settled) {
    for (int i = 0; i < 3; ++i) {
      auto st = nlohmann::json::parse(nodes[i]->HttpGet("/api/v1/status"), nullptr, false);
      std::printf("node %s: dram %s moved %.0f kept %.0f\n", ids[i],
                  st.is_discarded() ? "?" : st["dram"].dump().c_str(),
                  nodes[i]->Metric("kvpool_placement_moved_total"),
                  nodes[i]->Metric("kvpool_placement_kept_total"));
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(expected[i], 0) << ids[i];
    EXPECT_GE(double(entries[i]), expected[i] * 0.9) << ids[i];
    EXPECT_LE(double(entries[i]), expected[i] * 1.1) << ids[i];
    // And the shard map itself is close to even.
    EXPECT_NEAR(expected[i], kN / 3.0, kN / 30.0) << ids[i];
    EXPECT_EQ(hits[i], kN) << ids[i];
  }
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
}  // namespace kvpool::testing
