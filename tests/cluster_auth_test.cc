// Cluster authentication against real nodes (static --peers, UCX): nodes
// holding the cluster key serve each other, a node with another key or none
// (on hosts of their own: network namespaces) gets no value, directory
// answer or write in, an unauthenticated remote client gets nothing, a node
// with a loose key file does not start, and a key rotates without a stop.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>
#include <tuple>

#include <httplib.h>

#include "harness/cluster_harness.h"
#include "harness/netns_lab.h"
#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "transport/bootstrap_format.h"
#include "transport/peer_auth.h"
#include "transport/peer_seal.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;

// A `metric NAME VALUE` line on stdout: bench/compare.sh security collects
// them from this binary's run.
void Metric(const std::string& name, double value) {
  std::printf("metric %s %g\n", name.c_str(), value);
  std::fflush(stdout);
}

// A packet capture of every interface of a network namespace that counts
// the frames holding a byte string.
class WireTap {
 public:
  ~WireTap() { Stop(); }
  bool Start(const std::string& ns, std::vector<uint8_t> marker) {
    marker_ = std::move(marker);
    InNs(ns, [&] { fd_ = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL)); });
    if (fd_ < 0) return false;
    int bytes = 64 << 20;  // no frame dropped while the test is busy
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes));
    timeval tv{0, 100 * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    thread_ = std::thread([this] {
      std::vector<uint8_t> buf(256 * 1024);
      while (!stop_) {
        ssize_t n = recv(fd_, buf.data(), buf.size(), 0);
        if (n <= 0) continue;
        frames_++;
        bytes_ += static_cast<uint64_t>(n);
        if (std::search(buf.begin(), buf.begin() + n, marker_.begin(), marker_.end()) !=
            buf.begin() + n) {
          marked_++;
        }
      }
    });
    return true;
  }
  // Reads what is still queued, then stops.
  void Stop() {
    if (!thread_.joinable()) return;
    // Sleeps: a real socket: what is still queued arrives.
    std::this_thread::sleep_for(milliseconds(300));
    stop_ = true;
    thread_.join();
    close(fd_);
    fd_ = -1;
  }
  uint64_t frames() const { return frames_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t marked() const { return marked_; }

 private:
  std::vector<uint8_t> marker_;
  int fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> frames_{0}, bytes_{0}, marked_{0};
};

const char* kKey1 = "6b7670f06c2d636c75737465722d6b65792d6f6e652d666f722d746573747321";
const char* kKey2 = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

class ClusterAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool-auth-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    nodes_.clear();
    std::string cmd = "rm -rf '" + dir_ + "'";
    int r = system(cmd.c_str());
    (void)r;
  }
  // A key file with these lines, mode `mode`.
  std::string KeyFile(const std::string& name, const std::vector<std::string>& keys,
                      mode_t mode = 0600) {
    std::string path = dir_ + "/" + name;
    std::ofstream out(path);
    for (const auto& k : keys) out << k << "\n";
    out.close();
    chmod(path.c_str(), mode);
    return path;
  }
  // Starts node `id` of members `members` on `port`, with extra args.
  NodeProcess* Start(const std::string& id, const std::string& members, int port,
                     std::vector<std::string> extra, std::string* log = nullptr) {
    std::vector<std::string> args = {"--node-id", id, "--peers", members, "--peer-port",
                                     std::to_string(port)};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string l;
    auto n = NodeProcess::Start(args, "", &l);
    if (log != nullptr) *log = l;
    if (n == nullptr) return nullptr;
    nodes_.push_back(std::move(n));
    return nodes_.back().get();
  }
  // Nodes a and b of a static cluster, both holding kKey1.
  void StartKeyedPair(StaticCluster* c, NodeProcess** a, NodeProcess** b) {
    ASSERT_TRUE(c->PickPorts({"a", "b"}));
    std::string key = KeyFile("cluster.key", {kKey1});
    *a = Start("a", c->members, c->ports[0], {"--cluster-key-file", key});
    *b = Start("b", c->members, c->ports[1], {"--cluster-key-file", key});
    ASSERT_TRUE(*a && *b);
  }
  static ByteValues Values(size_t n, size_t bytes, uint8_t seed) {
    ByteValues v(n, std::vector<uint8_t>(bytes));
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < bytes; ++j) v[i][j] = static_cast<uint8_t>(seed + i * 13 + j * 7);
    }
    return v;
  }
  static void PutAll(const NodeProcess& n, const std::vector<kvpool_key_id>& ids,
                     const ByteValues& vals) {
    kvpool_client* c = OpenLocal(n, /*copy_mode=*/true);
    ASSERT_NE(c, nullptr);
    std::vector<kvpool_status> st(ids.size(), -1);
    EXPECT_EQ(PutValues(c, ids, vals, &st), KVPOOL_OK) << kvpool_last_error();
    kvpool_close(c);
  }
  static MaybeByteValues GetAll(const NodeProcess& n, const std::vector<kvpool_key_id>& ids) {
    kvpool_client* c = OpenLocal(n, /*copy_mode=*/true);
    if (c == nullptr) return {};
    MaybeByteValues got = GetValues(c, ids, 1 << 20);
    kvpool_close(c);
    return got;
  }
  static size_t Hits(const MaybeByteValues& got) {
    size_t n = 0;
    for (const auto& g : got) n += g.has_value() ? 1 : 0;
    return n;
  }
  // A counter's value, 0 before it first counts.
  static double Count(const NodeProcess& n, const std::string& series) {
    return std::max(0.0, n.Metric(series));
  }
  static double Refused(const NodeProcess& n, const char* reason) {
    return Count(n, std::string("kvpool_transport_bootstrap_refused_total{reason=\"") + reason +
                        "\"}");
  }
  static double Authenticated(const NodeProcess& n) {
    return Count(n, "kvpool_transport_authenticated_total{side=\"listener\"}");
  }

  void RemoteClientReadsAndWrites(bool encrypted);

  std::string dir_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
};

TEST_F(ClusterAuthTest, NodesHoldingTheKeyServeEachOthersValues) {
  StaticCluster c;
  NodeProcess *a = nullptr, *b = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartKeyedPair(&c, &a, &b));
  auto ids = NumberedKeys("auth", "k", 64);
  ByteValues vals = Values(ids.size(), 8192, 1);
  PutAll(*a, ids, vals);
  MaybeByteValues got;
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    got = GetAll(*b, ids);
    return AllHit(got);
  })) << Hits(got) << " of " << ids.size();
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  EXPECT_GE(Authenticated(*a), 1);
  EXPECT_GE(Authenticated(*b), 1);
  EXPECT_NE(a->Log().find("peer connections authenticated with 1 key"), std::string::npos)
      << a->Log();
}

// Hosts as deployed: nodes a and b on separate network namespaces (veth
// pairs on a bridge), non-loopback peer addresses, holding the key; an
// intruder x on a third host that believes it is the third member, first
// with another key, then with none (--insecure). It reads none of the
// cluster's values, the cluster reads none of its, its hand-offs (placement
// home) are never stored, and every refusal is counted by the node that
// refused it.
TEST_F(ClusterAuthTest, AcrossHostsANodeWithoutTheKeyGetsNothingInAndNothingOut) {
  std::string why = NetnsLab::Unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  NetnsLab lab;
  ASSERT_TRUE(lab.Init());
  for (int i = 1; i <= 3; ++i) ASSERT_FALSE(lab.AddHost(i).empty());
  setenv("UCX_TLS", "tcp", 1);  // peers talk over the veths
  const std::string port = "7411";
  std::string two = "a=" + lab.Ip(1) + ":" + port + ",b=" + lab.Ip(2) + ":" + port;
  std::string three = two + ",x=" + lab.Ip(3) + ":" + port;
  std::string key = KeyFile("cluster.key", {kKey1});
  auto start = [&](int host, const std::string& id, const std::string& members,
                   std::vector<std::string> extra) -> NodeProcess* {
    NodeProcess* n = nullptr;
    std::vector<std::string> args = {"--peer-address", lab.Ip(host)};
    args.insert(args.end(), extra.begin(), extra.end());
    InNs(lab.Host(host), [&] { n = Start(id, members, std::stoi(port), args); });
    return n;
  };
  // Admin endpoints listen on each host's own loopback.
  auto in = [&](int host, const std::function<void()>& fn) { InNs(lab.Host(host), fn); };
  NodeProcess* a = start(1, "a", two, {"--cluster-key-file", key});
  NodeProcess* b = start(2, "b", two, {"--cluster-key-file", key});
  ASSERT_TRUE(a && b);
  auto ours = NumberedKeys("auth", "ours-", 48);
  ByteValues our_vals = Values(ours.size(), 4096, 3);
  PutAll(*a, ours, our_vals);
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] { return AllHit(GetAll(*b, ours)); }));
  uint64_t a_entries = 0, b_entries = 0;
  in(1, [&] { a_entries = DramEntries(*a); });
  in(2, [&] { b_entries = DramEntries(*b); });

  int round = 0;
  double values_read = 0, writes_accepted = 0, wrong_key_refused = 0, wrong_key_accepted = 0;
  for (const char* mode : {"wrong_key", "no_key"}) {
    SCOPED_TRACE(mode);
    std::vector<std::string> xargs = {"--placement", "home"};
    if (std::string(mode) == "wrong_key") {
      xargs.insert(xargs.end(), {"--cluster-key-file", KeyFile("other.key", {kKey2})});
    } else {
      xargs.push_back("--insecure");
    }
    NodeProcess* x = start(3, "x", three, xargs);
    ASSERT_NE(x, nullptr);
    auto theirs = NumberedKeys("auth", std::string("theirs-") + mode + "-", 48);
    PutAll(*x, theirs, Values(theirs.size(), 4096, 9));  // hand-offs to a and b, refused
    // Every hand-off was tried and failed: x kept those values.
    in(3, [&] {
      EXPECT_TRUE(WaitFor(milliseconds(10000), [&] {
        return Count(*x, "kvpool_placement_kept_total") > 0 &&
               Count(*x, "kvpool_placement_inflight_bytes") == 0 &&
               Count(*x, "kvpool_placement_queued") == 0;
      })) << x->HttpGet("/metrics");
    });

    size_t read_by_x = Hits(GetAll(*x, ours));
    size_t read_via_a = Hits(GetAll(*a, theirs)), read_via_b = Hits(GetAll(*b, theirs));
    EXPECT_EQ(read_by_x, 0u) << "values of the cluster read by the intruder";
    EXPECT_EQ(read_via_a, 0u) << "intruder values read through a";
    EXPECT_EQ(read_via_b, 0u) << "intruder values read through b";
    values_read += static_cast<double>(read_by_x);
    writes_accepted += static_cast<double>(read_via_a + read_via_b);
    EXPECT_EQ(Hits(GetAll(*x, theirs)), theirs.size()) << "the intruder serves its own clients";
    const char* reason = std::string(mode) == "wrong_key" ? "unknown_key" : "auth_required";
    double refused = 0, a_now = 0, b_now = 0;
    std::string a_log = a->Log();
    in(1, [&] {
      refused += Refused(*a, reason);
      a_now = static_cast<double>(DramEntries(*a));
    });
    in(2, [&] {
      refused += Refused(*b, reason);
      b_now = static_cast<double>(DramEntries(*b));
    });
    EXPECT_GE(refused, 1) << reason;
    EXPECT_EQ(a_now, static_cast<double>(a_entries)) << "a stored something the intruder sent";
    EXPECT_EQ(b_now, static_cast<double>(b_entries)) << "b stored something the intruder sent";
    writes_accepted += (a_now - static_cast<double>(a_entries)) + (b_now - static_cast<double>(b_entries));
    if (std::string(mode) == "wrong_key") {
      wrong_key_refused = refused;
      in(3, [&] {
        wrong_key_accepted = Count(*x, "kvpool_transport_authenticated_total{side=\"connector\"}");
      });
      EXPECT_EQ(wrong_key_accepted, 0);
    }
    EXPECT_NE(a_log.find("refused peer"), std::string::npos) << a_log;
    if (round++ == 1) {
      EXPECT_NE(x->Log().find("INSECURE"), std::string::npos) << x->Log();
    }
    x->Stop(SIGKILL);
  }
  nodes_.clear();  // before the lab removes their namespaces
  Metric("unauthenticated_peer_values_read", values_read);
  Metric("unauthenticated_peer_writes_accepted", writes_accepted);
  Metric("wrong_key_joins_refused", wrong_key_refused);  // connections a and b refused
  Metric("wrong_key_joins_accepted", wrong_key_accepted);
}

// Hosts as deployed, with --peer-encryption: values cross between the
// hosts both ways (a fetch's reply, a placement hand-off's request) and
// arrive byte-exact, and a capture of every frame between the hosts finds
// none of their bytes. The same run without encryption finds them, which
// shows the capture sees the values' frames.
TEST_F(ClusterAuthTest, AcrossHostsAnEncryptedClusterPutsNoValueBytesOnTheWire) {
  std::string why = NetnsLab::Unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  NetnsLab lab;
  ASSERT_TRUE(lab.Init());
  for (int i = 1; i <= 2; ++i) ASSERT_FALSE(lab.AddHost(i).empty());
  setenv("UCX_TLS", "tcp", 1);
  const std::string port = "7412";
  std::string members = "a=" + lab.Ip(1) + ":" + port + ",b=" + lab.Ip(2) + ":" + port;
  std::string key = KeyFile("cluster.key", {kKey1});
  // Values full of a marker of random bytes, each with its number in front.
  std::vector<uint8_t> marker(16);
  std::ifstream("/dev/urandom").read(reinterpret_cast<char*>(marker.data()), marker.size());
  auto values = [&](size_t n, uint8_t seed) {
    ByteValues v(n, std::vector<uint8_t>(64 * 1024));
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < v[i].size(); ++j) v[i][j] = marker[j % marker.size()];
      v[i][0] = static_cast<uint8_t>(i);
      v[i][1] = seed;
    }
    return v;
  };
  double marked_plain = -1, marked_encrypted = -1;
  for (bool encrypted : {false, true}) {
    SCOPED_TRACE(encrypted ? "encrypted" : "authenticated only");
    std::vector<std::string> args = {"--cluster-key-file", key};
    if (encrypted) args.push_back("--peer-encryption");
    auto start = [&](int host, const std::string& id, std::vector<std::string> extra) {
      NodeProcess* n = nullptr;
      extra.insert(extra.end(), {"--peer-address", lab.Ip(host)});
      InNs(lab.Host(host), [&] { n = Start(id, members, std::stoi(port), extra); });
      return n;
    };
    WireTap tap;
    ASSERT_TRUE(tap.Start(lab.hub(), marker));
    NodeProcess* a = start(1, "a", args);
    std::vector<std::string> b_args = args;
    b_args.insert(b_args.end(), {"--placement", "home"});  // puts go to their homes
    NodeProcess* b = start(2, "b", b_args);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->Log().find("and encrypted") != std::string::npos, encrypted) << a->Log();
    std::string tag = encrypted ? "enc-" : "plain-";
    auto fetched = NumberedKeys("wire", tag + "fetched-", 32);
    ByteValues fetched_vals = values(fetched.size(), 1);
    PutAll(*a, fetched, fetched_vals);  // b reads them from a
    MaybeByteValues got;
    ASSERT_TRUE(WaitFor(milliseconds(10000), [&] {
      got = GetAll(*b, fetched);
      return AllHit(got);
    })) << Hits(got) << " of " << fetched.size();
    ASSERT_NO_FATAL_FAILURE(ExpectValues(got, fetched_vals));
    auto handed = NumberedKeys("wire", tag + "handed-", 32);
    ByteValues handed_vals = values(handed.size(), 2);
    PutAll(*b, handed, handed_vals);  // the keys homed at a are stored there by b
    ASSERT_TRUE(WaitFor(milliseconds(10000), [&] {
      got = GetAll(*a, handed);
      return AllHit(got);
    })) << Hits(got) << " of " << handed.size();
    ASSERT_NO_FATAL_FAILURE(ExpectValues(got, handed_vals));
    tap.Stop();
    EXPECT_GT(tap.bytes(), 32u * 64 * 1024) << "the capture saw less than the values' bytes";
    (encrypted ? marked_encrypted : marked_plain) = static_cast<double>(tap.marked());
    nodes_.clear();  // before the lab removes their namespaces
  }
  EXPECT_GT(marked_plain, 0) << "the capture never saw a value's bytes in the clear";
  EXPECT_EQ(marked_encrypted, 0) << "frames of an encrypted cluster held value bytes";
  Metric("peer_frames_with_value_bytes_plain", marked_plain);
  Metric("peer_frames_with_value_bytes_encrypted", marked_encrypted);
}

// A handshake recorded from the wire (hello and proof of a connection that
// was welcomed) and sent again on a new connection: the node's new nonce
// makes the recorded proof worthless, and it is refused and counted.
TEST_F(ClusterAuthTest, AHandshakeRecordedAndReplayedToANodeIsRefused) {
  StaticCluster c;
  NodeProcess *a = nullptr, *b = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartKeyedPair(&c, &a, &b));
  auto exchange = [&](int fd, const std::vector<uint8_t>& out, transport::BootstrapMessage* m) {
    if (send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
      return false;
    }
    std::vector<uint8_t> in;
    size_t used = 0;
    const char* reason = "";
    uint8_t buf[8192];
    while (transport::ParseBootstrap(in, m, &used, &reason) == transport::BootstrapParse::kNeedMore) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      in.insert(in.end(), buf, buf + n);
    }
    return true;
  };
  auto connect_to = [&](int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)), 0);
    return fd;
  };
  // The recording: a key holder's handshake with a, welcomed.
  auto keys = transport::LoadClusterKeyFile(KeyFile("k.key", {kKey1}));
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  transport::AuthConnector holder(keys->front(), "c/1");
  transport::BootstrapMessage hello, challenge, proof, answer;
  hello.body = *holder.Hello();
  std::vector<uint8_t> hello_bytes = transport::EncodeBootstrap(hello);
  int fd = connect_to(c.ports[0]);
  ASSERT_TRUE(exchange(fd, hello_bytes, &challenge));
  ASSERT_EQ(challenge.kind, transport::BootstrapKind::kChallenge);
  std::string listener;
  proof.kind = transport::BootstrapKind::kProof;
  proof.body = *holder.Answer(challenge.body, &listener);
  EXPECT_EQ(listener.substr(0, 2), "a/");
  std::vector<uint8_t> proof_bytes = transport::EncodeBootstrap(proof);
  ASSERT_TRUE(exchange(fd, proof_bytes, &answer));
  EXPECT_EQ(answer.kind, transport::BootstrapKind::kWelcome);
  close(fd);
  // The replays, to a and to b: a new challenge each time, then refused.
  int accepted = 0, refused = 0;
  for (int i = 0; i < 4; ++i) {
    fd = connect_to(c.ports[i % 2]);
    transport::BootstrapMessage fresh, verdict;
    ASSERT_TRUE(exchange(fd, hello_bytes, &fresh));
    ASSERT_EQ(fresh.kind, transport::BootstrapKind::kChallenge);
    EXPECT_NE(fresh.body, challenge.body);
    bool answered = exchange(fd, proof_bytes, &verdict);
    close(fd);
    if (answered && verdict.kind == transport::BootstrapKind::kWelcome) ++accepted;
    if (answered && verdict.kind == transport::BootstrapKind::kRefuse) {
      ++refused;
      std::string text(verdict.body.begin(), verdict.body.end());
      EXPECT_NE(text.find("permission denied"), std::string::npos) << text;
    }
  }
  EXPECT_EQ(accepted, 0);
  EXPECT_EQ(refused, 4);
  EXPECT_EQ(Refused(*a, "bad_proof"), 2);
  EXPECT_EQ(Refused(*b, "bad_proof"), 2);
  Metric("replayed_handshakes_accepted", accepted);
}

// A local user of another uid, without the key, reaching the peer port on
// loopback (the way around the socket's permissions) gets nothing.
TEST_F(ClusterAuthTest, ALocalUserWithoutTheKeyIsRefusedAtTheLoopbackPeerPort) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the client as another uid";
  StaticCluster c;
  NodeProcess *a = nullptr, *b = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartKeyedPair(&c, &a, &b));
  auto ids = NumberedKeys("auth", "u", 8);
  PutAll(*a, ids, Values(ids.size(), 4096, 9));
  const std::string peers = c.addrs[0] + "," + c.addrs[1];
  const std::string got = AsUser(65534, [&] {
    kvpool_options o;
    kvpool_options_init(&o);
    o.remote_peers = peers.c_str();
    o.timeout_ms = 2000;
    kvpool_status st = KVPOOL_OK;
    kvpool_client* rc = kvpool_open(&o, &st);
    if (rc != nullptr) kvpool_close(rc);
    return std::string(kvpool_status_name(st));
  });
  EXPECT_EQ(got, "PermissionDenied");
  EXPECT_GE(Refused(*a, "auth_required") + Refused(*b, "auth_required"), 1);
}

TEST_F(ClusterAuthTest, AnUnauthenticatedRemoteClientReadsAndWritesNothing) {
  StaticCluster c;
  NodeProcess *a = nullptr, *b = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartKeyedPair(&c, &a, &b));
  auto ids = NumberedKeys("auth", "r", 16);
  PutAll(*a, ids, Values(ids.size(), 4096, 5));
  kvpool_options o;
  kvpool_options_init(&o);
  std::string peers = c.addrs[0] + "," + c.addrs[1];
  o.remote_peers = peers.c_str();
  o.timeout_ms = 2000;
  kvpool_status st = KVPOOL_OK;
  kvpool_client* rc = kvpool_open(&o, &st);
  EXPECT_EQ(rc, nullptr);
  EXPECT_EQ(st, KVPOOL_PERMISSION_DENIED) << kvpool_status_name(st) << ": " << kvpool_last_error();
  if (rc != nullptr) kvpool_close(rc);
  EXPECT_GE(Refused(*a, "auth_required") + Refused(*b, "auth_required"), 1);
}

// A remote-mode client holding a client token reads the cluster's values
// and stores its own; with an unknown token it gets PERMISSION_DENIED.
// The same with --peer-encryption on the nodes: the client, which does not
// ask for it, follows them, and every connection it makes is encrypted.
TEST_F(ClusterAuthTest, ARemoteClientWithATokenReadsAndWrites) {
  for (bool encrypted : {false, true}) {
    SCOPED_TRACE(encrypted ? "encrypted" : "authenticated only");
    nodes_.clear();
    ASSERT_NO_FATAL_FAILURE(RemoteClientReadsAndWrites(encrypted));
  }
}

void ClusterAuthTest::RemoteClientReadsAndWrites(bool encrypted) {
  const char* kToken = "7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a";
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  std::string key = KeyFile("cluster.key", {kKey1});
  std::string tokens = KeyFile("clients.tokens", {std::string("engine-1 ") + kToken});
  std::vector<std::string> args = {"--cluster-key-file", key, "--client-token-file", tokens};
  if (encrypted) args.push_back("--peer-encryption");
  NodeProcess* a = Start("a", c.members, c.ports[0], args);
  NodeProcess* b = Start("b", c.members, c.ports[1], args);
  ASSERT_TRUE(a && b);
  auto ids = NumberedKeys("auth", "tok-", 32);
  ByteValues vals = Values(ids.size(), 4096, 21);
  PutAll(*a, ids, vals);
  std::string peers = c.addrs[0] + "," + c.addrs[1];
  auto open = [&](const std::string& token_file, kvpool_status* st) {
    kvpool_options o;
    kvpool_options_init(&o);
    o.remote_peers = peers.c_str();
    o.remote_token_file = token_file.c_str();
    o.timeout_ms = 3000;
    return kvpool_open(&o, st);
  };
  kvpool_status st = KVPOOL_OK;
  kvpool_client* rc = open(KeyFile("mine.token", {std::string("engine-1 ") + kToken}), &st);
  ASSERT_NE(rc, nullptr) << kvpool_status_name(st) << ": " << kvpool_last_error();
  MaybeByteValues got;
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    got = GetValues(rc, ids, 1 << 20);
    return AllHit(got);
  })) << Hits(got);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  auto own = NumberedKeys("auth", "tok-own-", 8);
  ByteValues own_vals = Values(own.size(), 4096, 33);
  std::vector<kvpool_status> item(own.size(), -1);
  EXPECT_EQ(PutValues(rc, own, own_vals, &item), KVPOOL_OK) << kvpool_last_error();
  kvpool_close(rc);
  // Listener-side encrypted connections: a's from b (and the client's), or none.
  const std::string enc = "kvpool_transport_encrypted_connections_total{side=\"listener\"}";
  if (encrypted) {
    EXPECT_GE(Count(*a, enc) + Count(*b, enc), 3) << "members and the client, encrypted";
  } else {
    EXPECT_EQ(Count(*a, enc) + Count(*b, enc), 0);
  }
  MaybeByteValues back;
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    back = GetAll(*a, own);
    return AllHit(back);
  })) << Hits(back);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(back, own_vals));
  // A token the nodes do not know.
  st = KVPOOL_OK;
  rc = open(KeyFile(encrypted ? "stolen2.token" : "stolen.token", {std::string("engine-1 ") + kKey2}), &st);
  EXPECT_EQ(rc, nullptr);
  EXPECT_EQ(st, KVPOOL_PERMISSION_DENIED) << kvpool_status_name(st) << ": " << kvpool_last_error();
  if (rc != nullptr) kvpool_close(rc);
}

// Remote-mode clients of a tenant (their token's name is in the tenants
// file): their keys live in the tenant's store on each key's home, and no
// client of another tenant or of the default one reads or poisons them.
TEST_F(ClusterAuthTest, RemoteClientsOfATenantShareOnlyTheirTenantsKeys) {
  const char* kTokA = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
  const char* kTokB = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";
  const char* kTokD = "d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4";
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  std::string key = KeyFile("cluster.key", {kKey1});
  std::string tokens = KeyFile("clients.tokens", {std::string("engine-a ") + kTokA,
                                                  std::string("engine-b ") + kTokB,
                                                  std::string("engine-d ") + kTokD});
  std::string tenants = KeyFile("tenants", {"tenant alpha dram=32MiB tokens=engine-a",
                                            "tenant beta dram=32MiB tokens=engine-b"},
                                0644);
  // Each tenant's figures are shown with the admin token (docs/tenants.md).
  std::string admin = KeyFile("admin.token", {"cluster-auth-test-admin-token-42"});
  std::vector<std::string> args = {"--cluster-key-file", key,     "--client-token-file", tokens,
                                   "--tenants-file",     tenants, "--admin-token-file",  admin};
  NodeProcess* a = Start("a", c.members, c.ports[0], args);
  NodeProcess* b = Start("b", c.members, c.ports[1], args);
  ASSERT_TRUE(a && b);
  std::string peers = c.addrs[0] + "," + c.addrs[1];
  auto open = [&](const std::string& name, const char* tok) {
    kvpool_options o;
    kvpool_options_init(&o);
    o.remote_peers = peers.c_str();
    std::string file = KeyFile(name + ".token", {name + " " + tok});
    o.remote_token_file = file.c_str();
    o.timeout_ms = 3000;
    kvpool_status st = KVPOOL_OK;
    kvpool_client* rc = kvpool_open(&o, &st);
    EXPECT_NE(rc, nullptr) << kvpool_status_name(st) << ": " << kvpool_last_error();
    return rc;
  };
  kvpool_client* ra = open("engine-a", kTokA);
  kvpool_client* rb = open("engine-b", kTokB);
  kvpool_client* rd = open("engine-d", kTokD);
  ASSERT_TRUE(ra && rb && rd);
  auto ids = NumberedKeys("shared-prefix", "block-", 32);
  ByteValues alpha = Values(ids.size(), 4096, 41), beta = Values(ids.size(), 4096, 42);
  std::vector<kvpool_status> st(ids.size(), -1);
  ASSERT_EQ(PutValues(ra, ids, alpha, &st), KVPOOL_OK) << kvpool_last_error();
  MaybeByteValues got = GetValues(ra, ids, 1 << 20);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, alpha));
  // The tenant's entries are in its stores, on the keys' homes.
  auto entries = [](const NodeProcess& n, const std::string& tenant) {
    return n.Metric("kvpool_tenant_dram_entries{tenant=\"" + tenant + "\"}");
  };
  EXPECT_EQ(entries(*a, "alpha") + entries(*b, "alpha"), 32);
  EXPECT_EQ(entries(*a, "default") + entries(*b, "default"), 0);
  // Another tenant, the default tenant's remote client and local clients
  // read nothing of them.
  int read = Hits(GetValues(rb, ids, 1 << 20)) + Hits(GetValues(rd, ids, 1 << 20));
  for (NodeProcess* n : {a, b}) {
    kvpool_client* lc = OpenLocal(*n, false);
    read += Hits(GetValues(lc, ids, 1 << 20));
    kvpool_close(lc);
  }
  EXPECT_EQ(read, 0);
  Metric("cross_tenant_values_read_remote", read);
  // Beta writes the same keys: its own entries; alpha still reads its bytes.
  std::vector<kvpool_status> stb(ids.size(), -1);
  ASSERT_EQ(PutValues(rb, ids, beta, &stb), KVPOOL_OK) << kvpool_last_error();
  ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(rb, ids, 1 << 20), beta));
  MaybeByteValues again = GetValues(ra, ids, 1 << 20);
  int poisoned = 0;
  for (size_t i = 0; i < ids.size(); ++i) poisoned += !again[i] || *again[i] != alpha[i];
  EXPECT_EQ(poisoned, 0);
  Metric("cross_tenant_poisoned_keys_remote", poisoned);
  kvpool_close(ra);
  kvpool_close(rb);
  kvpool_close(rd);
}

TEST_F(ClusterAuthTest, ALooseOrMissingKeyFileStopsTheStartSayingWhatToFix) {
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a"}));
  struct Case {
    std::string file;
    const char* says;
  };
  const Case cases[] = {
      {KeyFile("group.key", {kKey1}, 0640), "chmod 600"},
      {KeyFile("short.key", {"abcd"}, 0600), "64 hex digits"},
      {dir_ + "/missing.key", "No such file"},
  };
  for (const Case& k : cases) {
    std::string log;
    NodeProcess* n = Start("a", c.members, c.ports[0], {"--cluster-key-file", k.file}, &log);
    EXPECT_EQ(n, nullptr) << k.says;
    EXPECT_NE(log.find(k.says), std::string::npos) << log;
    EXPECT_NE(log.find(k.file), std::string::npos) << log;
  }
  // Encryption takes its keys from the cluster-key handshake.
  std::string log;
  EXPECT_EQ(Start("a", c.members, c.ports[0], {"--peer-encryption", "--insecure"}, &log), nullptr);
  EXPECT_NE(log.find("--peer-encryption needs --cluster-key-file"), std::string::npos) << log;
}

// Rotation without a stop: every node holds both keys, in either order
// (the first initiates), so connections in both directions authenticate.
TEST_F(ClusterAuthTest, AKeyRotatesWhileNodesHoldBoth) {
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  NodeProcess* a = Start("a", c.members, c.ports[0],
                         {"--cluster-key-file", KeyFile("a.key", {kKey1, kKey2})});
  NodeProcess* b = Start("b", c.members, c.ports[1],
                         {"--cluster-key-file", KeyFile("b.key", {kKey2, kKey1}, 0400)});
  ASSERT_TRUE(a && b);
  auto on_a = NumberedKeys("auth", "rot-a-", 32), on_b = NumberedKeys("auth", "rot-b-", 32);
  ByteValues va = Values(on_a.size(), 2048, 11), vb = Values(on_b.size(), 2048, 17);
  PutAll(*a, on_a, va);
  PutAll(*b, on_b, vb);
  MaybeByteValues got_b, got_a;
  ASSERT_TRUE(WaitFor(milliseconds(5000), [&] {
    got_b = GetAll(*b, on_a);
    got_a = GetAll(*a, on_b);
    return AllHit(got_a) && AllHit(got_b);
  })) << Hits(got_b) << " and " << Hits(got_a);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got_b, va));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got_a, vb));
  EXPECT_EQ(Refused(*a, "unknown_key") + Refused(*b, "unknown_key"), 0);
}

// The admin endpoint with a bearer token: everything but /healthz and
// /readyz needs it, kvpoolctl sends it from --token-file, and a weak or
// loose token file stops the start.
TEST_F(ClusterAuthTest, AnAdminTokenGuardsTheAdminEndpoint) {
  const std::string token = "c2VjcmV0LWFkbWluLXRva2VuLTEyMzQ1Ng";
  std::string file = KeyFile("admin.token", {token});
  NodeProcess* n = nullptr;
  {
    std::string log;
    auto p = NodeProcess::Start({"--admin-token-file", file}, "", &log);
    ASSERT_NE(p, nullptr) << log;
    nodes_.push_back(std::move(p));
    n = nodes_.back().get();
  }
  httplib::Client http("127.0.0.1", n->admin_port());
  auto denied = http.Get("/api/v1/status");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(denied->body.find("dram"), std::string::npos) << denied->body;
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  http.set_bearer_token_auth(token);
  auto status = http.Get("/api/v1/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  EXPECT_NE(status->body.find("dram"), std::string::npos);
  EXPECT_EQ(status->body.find(token), std::string::npos);  // never echoed
  auto config = http.Get("/api/v1/config");
  ASSERT_TRUE(config);
  EXPECT_EQ(config->body.find(token), std::string::npos) << config->body;

  std::string admin = "127.0.0.1:" + std::to_string(n->admin_port()), out;
  EXPECT_EQ(RunCommand({CtlBinary(), "metrics", "--admin", admin, "--token-file", file}, &out), 0);
  EXPECT_NE(out.find("kvpool_admin_unauthorized_total 1"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({CtlBinary(), "metrics", "--admin", admin}, &out, true), 3);
  EXPECT_NE(out.find("needs the node's admin token"), std::string::npos) << out;

  for (const auto& [name, text, says] :
       {std::tuple<std::string, std::string, std::string>{"short.token", "abc", "at least 16"},
        {"spaced.token", "has a space inside it", "without spaces"}}) {
    std::string log;
    auto bad = NodeProcess::Start({"--admin-token-file", KeyFile(name, {text})}, "", &log);
    EXPECT_EQ(bad, nullptr) << name;
    EXPECT_NE(log.find(says), std::string::npos) << log;
  }
  std::string log;
  auto loose = NodeProcess::Start({"--admin-token-file", KeyFile("loose.token", {token}, 0644)},
                                  "", &log);
  EXPECT_EQ(loose, nullptr);
  EXPECT_NE(log.find("chmod 600"), std::string::npos) << log;
}

}  // namespace
}  // namespace kvpool::testing
