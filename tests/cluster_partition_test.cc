// A cut link heals by itself: three nodes in network namespaces of their
// own (veth pairs on a bridge in a fourth namespace, which also runs etcd),
// all reaching etcd. The link between n1 (the holder) and n2 is cut with
// iptables in n1's namespace for longer than a publish's retries (8 s here;
// 15 s in production terms), n1 stores keys meanwhile, then the link is
// restored. No view changes (everyone keeps renewing with etcd), so only
// anti-entropy can tell n2 of the keys whose home it is. Repeated 5 times:
// no wrong byte, no read over 3 s, and every key stored during the cut is
// found through every node within 7 s of the heal: one anti-entropy interval
// and round, a digest's 2 s deadline, and a reconnect whose SYN may wait 1 s
// (2.9-4.0 s measured). Before a connection silent past a call's deadline
// was replaced, TCP's backed-off retransmission held the repair for 7-9 s.
//
// Needs root, `ip`, `iptables` and `etcd`; skipped without them. Touches
// only the namespaces it creates (removed at the end).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>

#include "harness/cluster_harness.h"
#include "harness/netns_lab.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;

constexpr size_t kKeys = 300;
constexpr size_t kValueBytes = 16384;

class PartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = NetnsLab::Unavailable();
    if (!why.empty() || !Have("iptables") || !Have("etcd")) {
      GTEST_SKIP() << "needs root, ip, iptables and etcd";
    }
    ASSERT_TRUE(lab_.Init());
    for (int i = 1; i <= 3; ++i) {
      std::string ns = lab_.AddHost(i);
      ASSERT_FALSE(ns.empty());
      ns_.push_back(ns);
    }
    hub_ = lab_.hub();
    net_ = lab_.net();
    // etcd in the hub namespace, on the bridge.
    char tmpl[] = "/tmp/kvpool-cut-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // The nodes authenticate each other, as deployed on a real network.
    key_file_ = dir_ + "/cluster.key";
    {
      std::ofstream key(key_file_);
      key << "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90\n";
    }
    ASSERT_EQ(chmod(key_file_.c_str(), 0600), 0);
    etcd_url_ = "http://" + net_ + "254:2379";
    etcd_pid_ = fork();
    if (etcd_pid_ == 0) {
      int fd = ::open((dir_ + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::string peer = "http://127.0.0.1:2380";
      execlp("ip", "ip", "netns", "exec", hub_.c_str(), "etcd", "--data-dir",
             (dir_ + "/etcd").c_str(), "--listen-client-urls", etcd_url_.c_str(),
             "--advertise-client-urls", etcd_url_.c_str(), "--listen-peer-urls", peer.c_str(),
             "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster",
             ("default=" + peer).c_str(), nullptr);
      _exit(127);
    }
    // The nodes' own UCX traffic must go over their veths (no shared memory).
    setenv("UCX_TLS", "tcp", 1);
  }

  void TearDown() override {
    nodes_.clear();
    if (etcd_pid_ > 0) {
      kill(etcd_pid_, SIGKILL);
      waitpid(etcd_pid_, nullptr, 0);
    }
    if (!dir_.empty()) Sh("rm -rf '" + dir_ + "'");
  }

  std::unique_ptr<NodeProcess> StartNode(int i) {
    std::unique_ptr<NodeProcess> n;
    std::string log;
    InNs(ns_[i - 1], [&] {
      n = NodeProcess::Start({"--node-id", "n" + std::to_string(i), "--etcd", etcd_url_,
                              "--cluster", "cut", "--peer-address", net_ + std::to_string(i),
                              "--cluster-key-file", key_file_, "--lease-ttl", "3s",
                              "--anti-entropy-interval",
                              "1s"},
                             "", &log);
    });
    EXPECT_NE(n, nullptr) << log;
    return n;
  }

  size_t MembersSeen(int i) {
    size_t n = 0;
    InNs(ns_[i], [&] { n = Members(*nodes_[i]).size(); });
    return n;
  }

  // Gets all keys through node i: hits that came back byte-exact, and
  // counts wrong bytes and the slowest call.
  size_t Found(int i, const std::vector<kvpool_key_id>& ids, const ByteValues& want) {
    kvpool_client* c = OpenLocal(*nodes_[i], true);
    if (c == nullptr) return 0;
    auto t0 = std::chrono::steady_clock::now();
    MaybeByteValues got = GetValues(c, ids, kValueBytes);
    slowest_ms_ = std::max(slowest_ms_, MsSince(t0));
    kvpool_close(c);
    size_t hits = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (!got[k]) continue;
      if (*got[k] == want[k]) {
        ++hits;
      } else {
        ++wrong_;
      }
    }
    return hits;
  }

  NetnsLab lab_;
  std::string net_, hub_, dir_, etcd_url_, key_file_;
  std::vector<std::string> ns_;
  pid_t etcd_pid_ = -1;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
  int64_t slowest_ms_ = 0;
  uint64_t wrong_ = 0;
};

TEST_F(PartitionTest, KeysStoredDuringACutLinkAreFoundEverywhereSoonAfterTheHeal) {
  // etcd answers on the bridge.
  ASSERT_TRUE(WaitFor(milliseconds(10000), [&] {
    bool ok = false;
    InNs(hub_, [&] {
      std::string out;
      ok = RunCommand({"/usr/bin/etcdctl", "--endpoints", etcd_url_, "endpoint", "health"}, &out,
                      true) == 0;
    });
    return ok;
  }));
  for (int i = 1; i <= 3; ++i) {
    nodes_.push_back(StartNode(i));
    ASSERT_NE(nodes_.back(), nullptr);
  }
  ASSERT_TRUE(WaitFor(milliseconds(10000), [&] {
    return MembersSeen(0) == 3 && MembersSeen(1) == 3 && MembersSeen(2) == 3;
  }));
  const std::string n2_ip = net_ + "2";
  int64_t worst_heal_ms = 0;
  double worst_share_during_cut = 1.0;
  for (int rep = 0; rep < 5; ++rep) {
    SCOPED_TRACE("rep " + std::to_string(rep));
    auto ids = NumberedKeys("cut", "r" + std::to_string(rep) + "-", kKeys);
    ByteValues vals;
    for (size_t k = 0; k < kKeys; ++k) vals.push_back(Pattern(rep * 100000 + k, kValueBytes));
    auto t_cut = std::chrono::steady_clock::now();
    ASSERT_EQ(Sh("ip netns exec " + ns_[0] + " iptables -A INPUT -s " + n2_ip +
                 " -j DROP && ip netns exec " + ns_[0] + " iptables -A OUTPUT -d " + n2_ip +
                 " -j DROP"),
              0);
    {
      kvpool_client* c = OpenLocal(*nodes_[0], true);
      ASSERT_NE(c, nullptr);
      std::vector<kvpool_status> st(kKeys, KVPOOL_INTERNAL);
      ASSERT_EQ(PutValues(c, ids, vals, &st), KVPOOL_OK) << kvpool_last_error();
      kvpool_close(c);
    }
    // Through n3 (links intact) during the cut: the keys whose home is n2
    // are unknown there.
    // Sleeps: real processes: the cut lasts 1.5 s.
    std::this_thread::sleep_for(milliseconds(1500));
    size_t during = Found(2, ids, vals);
    worst_share_during_cut = std::min(worst_share_during_cut, double(during) / kKeys);
    // Past every retry of the publishes to n2.
    std::this_thread::sleep_until(t_cut + milliseconds(8000));
    ASSERT_EQ(Sh("ip netns exec " + ns_[0] + " iptables -F"), 0);
    auto t_heal = std::chrono::steady_clock::now();
    bool all = WaitFor(
        milliseconds(7000),
        [&] {
          return Found(2, ids, vals) == kKeys && Found(1, ids, vals) == kKeys &&
                 Found(0, ids, vals) == kKeys;
        },
        milliseconds(200));
    int64_t heal_ms = MsSince(t_heal);
    EXPECT_TRUE(all) << "not every key found through every node 7 s after the heal";
    worst_heal_ms = std::max(worst_heal_ms, heal_ms);
    EXPECT_LT(heal_ms, 7000);
    EXPECT_EQ(wrong_, 0u);
    EXPECT_LT(slowest_ms_, 3000);
    // Nobody left the view: the repair was anti-entropy's.
    EXPECT_EQ(MembersSeen(0), 3u);
  }
  std::printf("cut link: worst time from heal until every key is found through every node: "
              "%lld ms; smallest share found through n3 during the cut: %.3f; slowest read "
              "%lld ms; wrong values %llu\n",
              static_cast<long long>(worst_heal_ms), worst_share_during_cut,
              static_cast<long long>(slowest_ms_), static_cast<unsigned long long>(wrong_));
}

}  // namespace
}  // namespace kvpool::testing
