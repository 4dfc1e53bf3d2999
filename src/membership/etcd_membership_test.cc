// Integration tests of EtcdMembership against a real etcd (TTL 2 s).
#include "membership/etcd_membership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <functional>
#include <thread>

#include "membership/etcd_client.h"
#include "membership/etcd_test_util.h"

namespace kvpool {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTtl{2000};

using testing::WaitFor;

// The fencing rule: fence when a peer renewed after this node's renewals
// began to fail (etcd is up: this node is cut) or when no peer can vouch;
// ride the outage out when the peers that answer cannot renew either.
TEST(JudgeLeaseTest, FencesWhenCutOrAloneKeepsTheViewWhenEtcdIsDownForAll) {
  auto t0 = SteadyClock::now();
  auto failing_since = t0 - milliseconds(500);
  auto report = [](bool answered, bool fenced, bool lease, SteadyClock::time_point renewed) {
    PeerLeaseReport r;
    r.answered = answered;
    r.fenced = fenced;
    r.has_lease = lease;
    r.renewed_at = renewed;
    return r;
  };
  std::string why;
  std::vector<PeerLeaseReport> none;
  EXPECT_EQ(JudgeLease(none, failing_since, &why), LeaseVerdict::kFence);
  std::vector<PeerLeaseReport> all_down = {report(true, false, true, t0 - milliseconds(900)),
                                           report(true, false, true, t0 - milliseconds(700))};
  EXPECT_EQ(JudgeLease(all_down, failing_since, &why), LeaseVerdict::kEtcdOutage);
  EXPECT_EQ(why, "etcd unreachable for 2 of 2 peers too");
  std::vector<PeerLeaseReport> one_renews = all_down;
  one_renews.push_back(report(true, false, true, t0 - milliseconds(100)));
  EXPECT_EQ(JudgeLease(one_renews, failing_since, &why), LeaseVerdict::kFence);
  EXPECT_EQ(why, "lease not renewed in time while 1 of 3 peers renew theirs");
  // Silent, fenced or lease-less peers vouch for nothing.
  std::vector<PeerLeaseReport> no_voice = {report(false, false, false, t0),
                                           report(true, true, true, t0 - milliseconds(900)),
                                           report(true, false, false, t0)};
  EXPECT_EQ(JudgeLease(no_voice, failing_since, &why), LeaseVerdict::kFence);
  no_voice.push_back(report(true, false, true, t0 - milliseconds(600)));
  EXPECT_EQ(JudgeLease(no_voice, failing_since, &why), LeaseVerdict::kEtcdOutage);
}

// A membership and the thread running its loop.
struct Node {
  std::unique_ptr<EtcdMembership> m;
  std::thread loop;

  void Start() {
    loop = std::thread([this] { m->Run(); });
  }
  void Stop(EtcdMembership::LeaveMode mode = EtcdMembership::LeaveMode::kRevokeLease) {
    if (!loop.joinable()) return;
    m->Stop(mode);
    loop.join();
  }
  ~Node() { Stop(); }
  size_t Members() const { return m->view()->members.size(); }
  bool Sees(const std::string& id) const { return m->view()->Find(id) != nullptr; }
};

class EtcdMembershipTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As kvpool-node does: a write to a connection etcd closed (a lease
    // revoked as a paused or stopping etcd drops it) is an error, not a
    // signal that ends the process.
    signal(SIGPIPE, SIG_IGN);
    auto s = EtcdTestServer::Start();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    etcd_ = std::move(s).value().release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }

  EtcdMembershipOptions Options(const std::string& id) {
    EtcdMembershipOptions o;
    o.endpoints = {etcd_->endpoint()};
    // Each test has a cluster of its own in the shared etcd.
    o.cluster = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    o.node_id = id;
    o.address = "127.0.0.1:" + std::to_string(7400 + id.back());
    o.lease_ttl = kTtl;
    o.request_timeout = milliseconds(500);
    o.retry_interval = milliseconds(200);
    return o;
  }

  std::unique_ptr<Node> StartNode(const std::string& id) {
    auto m = EtcdMembership::Open(Options(id), &metrics_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return nullptr;
    auto n = std::make_unique<Node>();
    n->m = std::move(m).value();
    n->Start();
    return n;
  }

  static EtcdTestServer* etcd_;
  MetricsRegistry metrics_;
};

EtcdTestServer* EtcdMembershipTest::etcd_ = nullptr;

TEST_F(EtcdMembershipTest, ThreeMembersSeeEachOther) {
  auto a = StartNode("a");
  ASSERT_NE(a, nullptr);
  std::atomic<int> changes{0};
  uint64_t sub = a->m->SubscribeViews([&](const auto&) { ++changes; });
  auto b = StartNode("b");
  auto c = StartNode("c");
  ASSERT_TRUE(b && c);
  for (Node* n : {a.get(), b.get(), c.get()}) {
    ASSERT_TRUE(WaitFor([&] { return n->Members() == 3; }, milliseconds(3000)));
  }
  auto va = a->m->view();
  EXPECT_EQ(va->Find("b")->incarnation, b->m->incarnation());
  EXPECT_EQ(va->Find("c")->address, "127.0.0.1:7499");
  EXPECT_EQ(va->Find("a")->incarnation, a->m->incarnation());
  // Same epoch, same view: the epoch is the etcd revision.
  ASSERT_TRUE(WaitFor([&] { return b->m->view()->epoch == va->epoch; }, milliseconds(2000)));
  EXPECT_EQ(b->m->view()->members, va->members);
  EXPECT_GE(changes.load(), 2);
  a->m->Unsubscribe(sub);
  EXPECT_FALSE(a->m->fenced());
  EXPECT_EQ(metrics_.ValueOf("kvpool_membership_fenced"), 0);
  EXPECT_EQ(metrics_.ValueOf("kvpool_membership_members"), 3);
  // Renewals every TTL/3.
  EXPECT_TRUE(WaitFor(
      [&] { return metrics_.ValueOf("kvpool_membership_lease_renewals_total") >= 3; },
      kTtl));
}

TEST_F(EtcdMembershipTest, DuplicateNodeIdIsRefused) {
  auto a = StartNode("a");
  ASSERT_NE(a, nullptr);
  EtcdMembershipOptions o = Options("a");
  o.live_id_margin = milliseconds(500);
  auto t0 = SteadyClock::now();
  auto dup = EtcdMembership::Open(o, nullptr);
  EXPECT_EQ(dup.status().code(), StatusCode::kFailedPrecondition) << dup.status().ToString();
  EXPECT_NE(dup.status().ToString().find("node id already live: a"), std::string::npos);
  // It waited for the live lease (renewed all along) for its TTL plus the
  // margin at most, then refused.
  EXPECT_GE(SteadyClock::now() - t0, o.live_id_margin);
  EXPECT_LT(SteadyClock::now() - t0, kTtl + o.live_id_margin + milliseconds(1000));
  // The refused attempt left the live member alone: it renews its lease
  // and keeps its registration.
  const double renewed = metrics_.ValueOf("kvpool_membership_lease_renewals_total");
  EXPECT_TRUE(WaitFor(
      [&] { return metrics_.ValueOf("kvpool_membership_lease_renewals_total") > renewed; }, kTtl));
  EXPECT_TRUE(a->Sees("a"));
  EXPECT_FALSE(a->m->fenced());
}

// A node killed and started again inside its old lease's TTL waits for that
// lease to expire (bounded), then registers under a new incarnation, so a
// supervisor's restart-on-failure needs no delay of its own.
TEST_F(EtcdMembershipTest, RestartInsideTheTtlWaitsForTheOldLease) {
  auto a = StartNode("a");
  ASSERT_NE(a, nullptr);
  uint64_t old_incarnation = a->m->incarnation();
  a->Stop(EtcdMembership::LeaveMode::kAbandonLease);  // a crash: the lease stays
  auto t0 = SteadyClock::now();
  EtcdMembershipOptions o = Options("a");
  auto again = EtcdMembership::Open(o, &metrics_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto waited = SteadyClock::now() - t0;
  EXPECT_LT(waited, kTtl + o.live_id_margin);
  EXPECT_GT(waited, milliseconds(500));  // the old lease had most of its TTL left
  EXPECT_GT((*again)->incarnation(), old_incarnation);
  ASSERT_NE((*again)->view()->Find("a"), nullptr);
  EXPECT_EQ((*again)->view()->Find("a")->incarnation, (*again)->incarnation());
}

// Under OldLeaseWait::kInRun, Open() returns at once with the node joining
// (fenced: no remote work), and the loop registers as soon as the old lease
// is gone.
TEST_F(EtcdMembershipTest, UnderInRunARestartJoinsInTheLoopOnceTheOldLeaseExpires) {
  auto a = StartNode("a");
  ASSERT_NE(a, nullptr);
  uint64_t old_incarnation = a->m->incarnation();
  a->Stop(EtcdMembership::LeaveMode::kAbandonLease);
  EtcdMembershipOptions o = Options("a");
  o.old_lease_wait = EtcdMembershipOptions::OldLeaseWait::kInRun;
  int refused = 0;
  o.on_refused = [&](const Status&) { ++refused; };
  auto t0 = SteadyClock::now();
  auto again = EtcdMembership::Open(o, &metrics_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_LT(SteadyClock::now() - t0, milliseconds(500));
  Node n;
  n.m = std::move(again).value();
  EXPECT_TRUE(n.m->joining());
  EXPECT_TRUE(n.m->fenced());
  EXPECT_NE(n.m->joining_reason().find("node id a is still registered"), std::string::npos)
      << n.m->joining_reason();
  n.Start();
  ASSERT_TRUE(WaitFor([&] { return !n.m->joining(); }, kTtl + o.live_id_margin));
  EXPECT_GT(SteadyClock::now() - t0, milliseconds(500));  // the old lease had most of its TTL left
  EXPECT_FALSE(n.m->fenced());
  EXPECT_EQ(n.m->joining_reason(), "");
  EXPECT_GT(n.m->incarnation(), old_incarnation);
  // The view shows the new registration (the old one may still be listed
  // until the watch brings its replacement).
  EXPECT_TRUE(WaitFor(
      [&] {
        const Member* m = n.m->view()->Find("a");
        return m != nullptr && m->incarnation == n.m->incarnation();
      },
      milliseconds(2000)));
  EXPECT_EQ(refused, 0);
}

// Under kInRun a duplicate id of a live process is refused once the wait is
// over: on_refused once, the node stays out, the live member is untouched.
TEST_F(EtcdMembershipTest, UnderInRunALiveDuplicateIsRefusedOnceAfterTheWait) {
  auto a = StartNode("a");
  ASSERT_NE(a, nullptr);
  EtcdMembershipOptions o = Options("a");
  o.old_lease_wait = EtcdMembershipOptions::OldLeaseWait::kInRun;
  o.live_id_margin = milliseconds(300);
  std::atomic<int> refused{0};
  std::string why;
  o.on_refused = [&](const Status& s) {
    why = s.ToString();
    ++refused;
  };
  MetricsRegistry dup_metrics;
  auto dup = EtcdMembership::Open(o, &dup_metrics);
  ASSERT_TRUE(dup.ok()) << dup.status().ToString();
  Node n;
  n.m = std::move(dup).value();
  n.Start();
  ASSERT_TRUE(WaitFor([&] { return refused.load() > 0; }, kTtl + o.live_id_margin + milliseconds(1000)));
  // Two more tries to join: still refused once.
  const double tries = dup_metrics.ValueOf("kvpool_membership_join_attempts_total");
  EXPECT_TRUE(WaitFor(
      [&] { return dup_metrics.ValueOf("kvpool_membership_join_attempts_total") >= tries + 2; },
      milliseconds(3000)));
  EXPECT_EQ(refused.load(), 1);
  EXPECT_NE(why.find("node id already live: a"), std::string::npos) << why;
  EXPECT_TRUE(n.m->joining());
  EXPECT_TRUE(n.m->fenced());
  EXPECT_TRUE(a->Sees("a"));
  EXPECT_FALSE(a->m->fenced());
}

// Registrations prove holding a key: one without a valid proof (none, or
// made with another key) is left out of every prover's view and counted;
// it sees everyone (it checks nothing).
TEST_F(EtcdMembershipTest, RegistrationsWithoutAValidProofAreLeftOutOfTheView) {
  auto proven = [&](const std::string& id, const std::string& key) {
    EtcdMembershipOptions o = Options(id);
    o.prove = [key](const std::string& record) { return std::vector<std::string>{key + record}; };
    o.verify = [key](const std::string& record, const std::vector<std::string>& proofs) {
      return std::find(proofs.begin(), proofs.end(), key + record) != proofs.end();
    };
    auto m = EtcdMembership::Open(o, &metrics_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    auto n = std::make_unique<Node>();
    n->m = std::move(m).value();
    n->Start();
    return n;
  };
  auto a = proven("a", "K1:");
  auto b = proven("b", "K1:");
  MetricsRegistry other;
  auto x_opts = Options("x");  // no proof
  auto xm = EtcdMembership::Open(x_opts, &other);
  ASSERT_TRUE(xm.ok());
  Node x;
  x.m = std::move(xm).value();
  x.Start();
  EtcdMembershipOptions y_opts = Options("y");  // another key's proof
  y_opts.prove = [](const std::string& record) { return std::vector<std::string>{"K2:" + record}; };
  auto ym = EtcdMembership::Open(y_opts, nullptr);
  ASSERT_TRUE(ym.ok());
  Node y;
  y.m = std::move(ym).value();
  y.Start();
  ASSERT_TRUE(WaitFor([&] { return x.Members() == 4; }, milliseconds(3000)));
  ASSERT_TRUE(WaitFor([&] { return metrics_.ValueOf("kvpool_membership_unproven_members") == 2; },
                      milliseconds(3000)));
  for (Node* n : {a.get(), b.get()}) {
    EXPECT_EQ(n->Members(), 2u);
    EXPECT_TRUE(n->Sees("a") && n->Sees("b"));
    EXPECT_FALSE(n->Sees("x") || n->Sees("y"));
  }
  // a and b each counted x and y once (one registry for both here).
  EXPECT_EQ(metrics_.ValueOf("kvpool_membership_unproven_registrations_total"), 4);
  y.Stop();
  x.Stop();
  EXPECT_TRUE(WaitFor([&] { return metrics_.ValueOf("kvpool_membership_unproven_members") == 0; },
                      milliseconds(3000)));
  EXPECT_EQ(a->Members(), 2u);
}

TEST_F(EtcdMembershipTest, IncarnationsIncreaseAcrossRestarts) {
  uint64_t prev = 0;
  for (int i = 0; i < 3; ++i) {
    auto a = StartNode("a");
    ASSERT_NE(a, nullptr);
    EXPECT_GT(a->m->incarnation(), prev);
    EXPECT_EQ(a->m->view()->Find("a")->incarnation, a->m->incarnation());
    prev = a->m->incarnation();
    a->Stop();
  }
  auto b = StartNode("b");
  ASSERT_NE(b, nullptr);
  EXPECT_GT(b->m->incarnation(), prev);  // one counter for the cluster
}

TEST_F(EtcdMembershipTest, StopRemovesTheMemberAtOnce) {
  auto a = StartNode("a");
  auto b = StartNode("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return a->Sees("b"); }, milliseconds(3000)));
  auto t0 = SteadyClock::now();
  b->Stop();
  // Well under the TTL: the lease was revoked, not left to expire.
  EXPECT_TRUE(WaitFor([&] { return !a->Sees("b"); }, milliseconds(1000)));
  EXPECT_LT(SteadyClock::now() - t0, kTtl);
}

TEST_F(EtcdMembershipTest, CrashedMemberLeavesWithinTtlPlusTwoSeconds) {
  auto a = StartNode("a");
  auto b = StartNode("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return a->Sees("b"); }, milliseconds(3000)));
  auto t0 = SteadyClock::now();
  b->Stop(EtcdMembership::LeaveMode::kAbandonLease);  // no more keepalives, no revoke
  ASSERT_TRUE(WaitFor([&] { return !a->Sees("b"); }, kTtl + milliseconds(2000)));
  // It left by lease expiry, not at once.
  EXPECT_GT(SteadyClock::now() - t0, kTtl / 2);
  EXPECT_TRUE(a->Sees("a"));
}

TEST_F(EtcdMembershipTest, EtcdPauseFencesKeepsViewsAndRecoversWithNewIncarnations) {
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* id : {"a", "b", "c"}) nodes.push_back(StartNode(id));
  for (auto& n : nodes) ASSERT_TRUE(n && WaitFor([&] { return n->Members() == 3; }, milliseconds(3000)));
  std::vector<uint64_t> before;
  for (auto& n : nodes) before.push_back(n->m->incarnation());
  std::atomic<int> fence_calls{0};
  uint64_t sub = nodes[0]->m->SubscribeFence([&](bool f) { fence_calls += f ? 1 : 0; });

  // Let the nodes renew a few times, so the pause hits them mid-lease.
  ASSERT_TRUE(WaitFor(
      [&] { return metrics_.ValueOf("kvpool_membership_lease_renewals_total") >= 6; },
      kTtl * 2));
  etcd_->Pause();
  auto t0 = SteadyClock::now();
  // TTL/2 + 1 s to fence.
  bool all_fenced = WaitFor(
      [&] {
        for (auto& n : nodes) {
          if (!n->m->fenced()) return false;
        }
        return true;
      },
      kTtl / 2 + milliseconds(1000));
  auto fenced_after = SteadyClock::now() - t0;
  // The views do not lose anybody while etcd is away (watched until 3.5 s).
  const bool views_kept = !WaitFor(
      [&] {
        for (auto& n : nodes) {
          if (n->Members() != 3) return true;
        }
        return false;
      },
      std::chrono::duration_cast<milliseconds>(t0 + milliseconds(3500) - SteadyClock::now()));
  etcd_->Resume();
  EXPECT_TRUE(all_fenced) << "after "
                          << std::chrono::duration_cast<milliseconds>(fenced_after).count();
  EXPECT_TRUE(views_kept);
  EXPECT_EQ(fence_calls.load(), 1);
  EXPECT_EQ(metrics_.ValueOf("kvpool_membership_fenced"), 1);

  // Back: everybody registers again with a new incarnation; nobody is lost.
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node* n = nodes[i].get();
    ASSERT_TRUE(WaitFor([&] { return !n->m->fenced(); }, milliseconds(5000))) << i;
    EXPECT_GT(n->m->incarnation(), before[i]);
  }
  for (auto& n : nodes) {
    ASSERT_TRUE(WaitFor(
        [&] {
          auto v = n->m->view();
          if (v->members.size() != 3) return false;
          for (auto& other : nodes) {
            const Member* m = v->Find(other->m->node_id());
            if (m == nullptr || m->incarnation != other->m->incarnation()) return false;
          }
          return true;
        },
        milliseconds(5000)));
  }
  nodes[0]->m->Unsubscribe(sub);
}

// etcd comes back during an outage the node rides out, and its peers
// renew first: their fresh renewals are evidence that etcd answers again,
// not that this node is cut, so it renews once itself before judging. Its
// lease still holds (etcd was away for less than the TTL): no fence, same
// incarnation. The peers are stood in by probe_peers: the first probe says
// etcd is down for them too, the second resumes etcd and says a peer has
// just renewed.
TEST_F(EtcdMembershipTest, PeersRenewingFirstAfterAnOutageDoNotFenceANodeWhoseLeaseHolds) {
  std::atomic<int> probes{0};
  std::atomic<bool> resumed{false};
  EtcdMembershipOptions o = Options("a");
  o.lease_ttl = milliseconds(4000);
  o.probe_peers = [&](SteadyClock::time_point) {
    PeerLeaseReport r;
    r.answered = true;
    r.has_lease = true;
    if (++probes == 1) return std::vector<PeerLeaseReport>{r};  // renewed_at: long ago
    if (!resumed.exchange(true)) etcd_->Resume();
    r.renewed_at = SteadyClock::now();
    return std::vector<PeerLeaseReport>{r};
  };
  auto m = EtcdMembership::Open(o, &metrics_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Node n;
  n.m = std::move(m).value();
  n.Start();
  ASSERT_TRUE(
      WaitFor([&] { return metrics_.ValueOf("kvpool_membership_lease_renewals_total") >= 2; },
              milliseconds(6000)));
  const uint64_t inc = n.m->incarnation();
  etcd_->Pause();
  bool second_probe = WaitFor([&] { return probes.load() >= 2; }, milliseconds(5000));
  if (!resumed.exchange(true)) etcd_->Resume();
  ASSERT_TRUE(second_probe);
  // Renewed, out of the outage, and never fenced on the way.
  EXPECT_TRUE(WaitFor([&] { return !n.m->etcd_outage(); }, milliseconds(3000)));
  EXPECT_FALSE(WaitFor([&] { return n.m->fenced(); }, milliseconds(1500)));
  EXPECT_EQ(metrics_.ValueOf("kvpool_membership_fenced"), 0);
  EXPECT_EQ(n.m->incarnation(), inc);
  EXPECT_EQ(probes.load(), 2);
  n.Stop();
}

// An etcd that answers slowly at start (here: hung for 1.5 s) is waited
// for: the registration goes through once it answers, exactly once.
TEST_F(EtcdMembershipTest, OpenWaitsForASlowEtcd) {
  etcd_->Pause();
  std::thread resume([] {
    // Sleeps: a real etcd, paused: it answers 1.5 s late.
    std::this_thread::sleep_for(milliseconds(1500));
    etcd_->Resume();
  });
  auto t0 = SteadyClock::now();
  auto m = EtcdMembership::Open(Options("a"), &metrics_);
  auto took = SteadyClock::now() - t0;
  resume.join();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GE(took, milliseconds(1400));
  EXPECT_EQ((*m)->view()->members.size(), 1u);
  EXPECT_GT((*m)->incarnation(), 0u);
  EXPECT_GE(metrics_.ValueOf("kvpool_membership_etcd_errors_total", {{"kind", "timeout"}}), 1);
}

TEST(EtcdMembershipNoEtcdTest, OpenFailsFastWhenEtcdIsUnreachable) {
  EtcdMembershipOptions o;
  o.endpoints = {"http://127.0.0.1:1"};
  o.node_id = "a";
  o.address = "127.0.0.1:7400";
  o.lease_ttl = kTtl;
  o.request_timeout = milliseconds(300);
  MetricsRegistry metrics;
  auto t0 = SteadyClock::now();
  auto m = EtcdMembership::Open(o, &metrics);
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status().ToString();
  EXPECT_LT(SteadyClock::now() - t0, milliseconds(2000));
  EXPECT_EQ(metrics.ValueOf("kvpool_membership_etcd_errors_total", {{"kind", "connect"}}), 1);
}

TEST(EtcdMembershipOptionsTest, Validates) {
  EtcdMembershipOptions o;
  o.endpoints = {"http://127.0.0.1:2379"};
  o.node_id = "a";
  o.address = "h:1";
  EXPECT_TRUE(o.Validate().ok());
  o.node_id = "a/b";
  EXPECT_FALSE(o.Validate().ok());
  o.node_id = "a";
  o.lease_ttl = milliseconds(1000);
  EXPECT_FALSE(o.Validate().ok());
  o.lease_ttl = milliseconds(2000);
  o.request_timeout = milliseconds(1000);
  EXPECT_FALSE(o.Validate().ok());
}

TEST(EtcdClientTest, Base64RoundTripsAndPrefixEnd) {
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    std::string back;
    ASSERT_TRUE(EtcdClient::Base64Decode(EtcdClient::Base64Encode(s), &back));
    EXPECT_EQ(back, s);
  }
  EXPECT_EQ(EtcdClient::Base64Encode("kvpool"), "a3Zwb29s");
  std::string out;
  EXPECT_FALSE(EtcdClient::Base64Decode("a3Z", &out));
  EXPECT_FALSE(EtcdClient::Base64Decode("a3Z*", &out));
  EXPECT_EQ(EtcdClient::PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(EtcdClient::PrefixEnd(std::string("a\xff", 2)), "b");
}

}  // namespace
}  // namespace kvpool
