// The peer port as an attacker and an operator see it, against real nodes:
// random and mutated byte sequences sent to every TCP port a node listens on
// do not kill it, the node listens on its configured address only, and a
// killed node takes its peer port back at once. (UCX's own port is not
// safe against a sender who speaks UCX's TCP protocol: docs/cluster.md,
// "UCX's own port"; the node warns at start until the port is pinned.)
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <sstream>

#include "harness/cluster_harness.h"
#include "transport/bootstrap_format.h"
#include "transport/peer_auth.h"

namespace kvpool::testing {
namespace {

struct Listener {
  std::string host;  // dotted quad, or "v6" for any IPv6 listener
  int port = 0;
};

// The TCP sockets in LISTEN state that process pid holds, from /proc.
std::vector<Listener> ListeningSockets(pid_t pid) {
  std::set<std::string> inodes;
  std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256] = {};
      std::string link = fd_dir + "/" + e->d_name;
      ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n > 0 && std::strncmp(target, "socket:[", 8) == 0) {
        inodes.insert(std::string(target + 8, target + n - 1));
      }
    }
    closedir(d);
  }
  std::vector<Listener> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string sl, local, remote, state, queues, tr, retr, uid, timeout, inode;
      row >> sl >> local >> remote >> state >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.contains(inode)) continue;
      size_t colon = local.find(':');
      Listener l;
      l.port = static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16));
      if (std::string(table) == "tcp") {
        in_addr a;
        a.s_addr = static_cast<uint32_t>(std::stoul(local.substr(0, colon), nullptr, 16));
        l.host = inet_ntoa(a);
      } else {
        l.host = "v6";
      }
      out.push_back(l);
    }
  }
  return out;
}

bool Alive(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == 0 && kill(pid, 0) == 0;
}

// Connects, sends bytes (possibly in pieces), then closes: with a reset
// half of the time so the test leaves few TIME_WAIT sockets behind.
void SendAndClose(int port, const std::vector<uint8_t>& bytes, std::mt19937_64& rng) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    size_t off = 0;
    while (off < bytes.size()) {
      size_t piece = std::min<size_t>(bytes.size() - off, 1 + rng() % (bytes.size() + 1));
      ssize_t n = send(fd, bytes.data() + off, piece, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    if (rng() % 2 == 0) {
      linger lg{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
  }
  close(fd);
}

// A real UCX worker address (network devices only), as a peer's hello
// would carry it.
std::vector<uint8_t> RealWorkerAddress() {
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_AM;
  ucp_context_h ctx = nullptr;
  ucp_config_t* cfg = nullptr;
  if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return {};
  ucp_config_modify(cfg, "NET_DEVICES", "lo");
  ucs_status_t s = ucp_init(&p, cfg, &ctx);
  ucp_config_release(cfg);
  if (s != UCS_OK) return {};
  ucp_worker_params_t wp{};
  ucp_worker_h w = nullptr;
  std::vector<uint8_t> out;
  if (ucp_worker_create(ctx, &wp, &w) == UCS_OK) {
    ucp_worker_attr_t wa{};
    wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    wa.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    if (ucp_worker_query(w, &wa) == UCS_OK) {
      const auto* b = reinterpret_cast<const uint8_t*>(wa.address);
      out.assign(b, b + wa.address_length);
      ucp_worker_release_address(w, wa.address);
    }
    ucp_worker_destroy(w);
  }
  ucp_cleanup(ctx);
  return out;
}

// 73 bytes: a little-endian u64 length, a status byte, 64 bytes of anything.
std::vector<uint8_t> LengthProbe(uint64_t length, std::mt19937_64& rng) {
  std::vector<uint8_t> m(73);
  std::memcpy(m.data(), &length, 8);
  for (size_t i = 8; i < m.size(); ++i) m[i] = static_cast<uint8_t>(rng());
  return m;
}

std::vector<uint8_t> Mutate(std::vector<uint8_t> m, std::mt19937_64& rng) {
  switch (rng() % 6) {
    case 0:  // flip bits
      for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n && !m.empty(); ++i) {
        m[rng() % m.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
      break;
    case 1:  // overwrite bytes
      for (int i = 0, n = 1 + static_cast<int>(rng() % 16); i < n && !m.empty(); ++i) {
        m[rng() % m.size()] = static_cast<uint8_t>(rng());
      }
      break;
    case 2:  // truncate
      m.resize(rng() % (m.size() + 1));
      break;
    case 3:  // extend with garbage
      for (int i = 0, n = 1 + static_cast<int>(rng() % 256); i < n; ++i) {
        m.push_back(static_cast<uint8_t>(rng()));
      }
      break;
    case 4: {  // a boundary value in a length-sized field
      static const uint32_t kEdges[] = {0, 1, 15, 16, 4095, 4096, 4097, 0x7FFFFFFF, 0xFFFFFFFF};
      uint32_t v = kEdges[rng() % std::size(kEdges)];
      if (m.size() >= 4) std::memcpy(m.data() + (rng() % (m.size() - 3)), &v, 4);
      break;
    }
    default:  // the address body replaced by random bytes of the same length
      for (size_t i = transport::kBootstrapHeaderBytes; i < m.size(); ++i) {
        m[i] = static_cast<uint8_t>(rng());
      }
  }
  return m;
}

TEST(PeerPort, GarbageOnEveryListeningPortNeverKillsANode) {
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  ASSERT_TRUE(c.StartNodes({"a", "b"}));
  NodeProcess& a = *c.nodes[0];

  // Values on b, read through a: peer traffic runs before and after.
  kvpool_client* cb = OpenLocal(*c.nodes[1], /*copy_mode=*/true);
  kvpool_client* ca = OpenLocal(a, /*copy_mode=*/true);
  ASSERT_NE(cb, nullptr);
  ASSERT_NE(ca, nullptr);
  auto ids = NumberedKeys("fuzz", "k", 32);
  ByteValues vals;
  for (size_t i = 0; i < ids.size(); ++i) vals.push_back(Pattern(i, 4096 + i));
  std::vector<kvpool_status> st(ids.size(), KVPOOL_OK);
  ASSERT_EQ(PutValues(cb, ids, vals, &st), KVPOOL_OK);
  ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] { return AllHit(GetValues(ca, ids, 8192)); }));

  // The node listens on the configured loopback address only: its admin
  // port, its peer port and UCX's own TCP listener, nothing on IPv6 or on
  // another interface.
  std::vector<Listener> ls = ListeningSockets(a.pid());
  std::set<int> ports;
  for (const Listener& l : ls) {
    EXPECT_EQ(l.host, "127.0.0.1") << "port " << l.port;
    ports.insert(l.port);
  }
  EXPECT_TRUE(ports.contains(a.admin_port()));
  EXPECT_TRUE(ports.contains(c.ports[0]));
  std::string listed;
  for (int p : ports) listed += std::to_string(p) + " ";
  std::printf("LISTENERS %s(admin %d, peer %d)\n", listed.c_str(), a.admin_port(), c.ports[0]);

  std::mt19937_64 rng(0xC0FFEE);
  const std::vector<uint8_t> valid_hello = transport::EncodeBootstrap({});
  // A welcome-shaped message with a real UCX worker address: the listener
  // takes nothing but a hello, and never hands a sender's bytes to UCX.
  transport::BootstrapMessage welcome;
  welcome.kind = transport::BootstrapKind::kWelcome;
  welcome.token = 1;
  welcome.body = RealWorkerAddress();
  ASSERT_FALSE(welcome.body.empty());
  const std::vector<uint8_t> valid_welcome = transport::EncodeBootstrap(welcome);
  const uint64_t kBadLengths[] = {0, 1, 56, ~uint64_t{0} - 15, ~uint64_t{0}};
  constexpr int kMessages = 10000;
  int sent = 0;
  for (int port : ports) {
    for (uint64_t len : kBadLengths) SendAndClose(port, LengthProbe(len, rng), rng);
    for (int i = 0; i < kMessages; ++i) {
      std::vector<uint8_t> m;
      switch (i % 4) {
        case 0:  // random bytes of a random length
          m.resize(rng() % 512);
          for (auto& b : m) b = static_cast<uint8_t>(rng());
          break;
        case 1:
          m = Mutate(LengthProbe(rng() % 128, rng), rng);
          break;
        case 2:
          m = Mutate(valid_hello, rng);
          break;
        default:
          m = Mutate(valid_welcome, rng);
      }
      SendAndClose(port, m, rng);
      ++sent;
      if (i % 1000 == 999) {
        ASSERT_TRUE(Alive(a.pid())) << "died on port " << port << "\n" << a.Log();
      }
    }
  }
  ASSERT_TRUE(Alive(a.pid())) << a.Log();
  // A whole valid hello from a stranger is welcomed and then closed by it:
  // harmless.
  for (int i = 0; i < 20; ++i) SendAndClose(c.ports[0], valid_hello, rng);

  int http = 0;
  a.HttpGet("/healthz", &http);
  EXPECT_EQ(http, 200);
  EXPECT_GT(a.Metric("kvpool_transport_bootstrap_refused_total{reason=\"bad_magic\"}"), 0);
  // Peers still talk: b's values read through a, byte-exact, and new ones too.
  auto more = NumberedKeys("fuzz", "after", 16);
  ByteValues more_vals;
  for (size_t i = 0; i < more.size(); ++i) more_vals.push_back(Pattern(1000 + i, 2048));
  std::vector<kvpool_status> st2(more.size(), KVPOOL_OK);
  ASSERT_EQ(PutValues(cb, more, more_vals, &st2), KVPOOL_OK);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(ca, ids, 8192), vals));
  ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] { return AllHit(GetValues(ca, more, 4096)); }));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(ca, more, 4096), more_vals));
  std::printf("SUMMARY {\"ports\":%zu,\"messages\":%d,\"alive\":true}\n", ports.size(), sent);
  kvpool_close(ca);
  kvpool_close(cb);
}

// UCX's own port: a node warns that the cluster key does not cover it, and
// UCX_TCP_PORT_RANGE pins it where a firewall rule can name it (no warning).
TEST(PeerPort, UcxsOwnPortWarnsUntilPinnedAndListensWherePinned) {
  const std::string kWarning = "UCX's own data port";
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  unsetenv("UCX_TCP_PORT_RANGE");
  ASSERT_TRUE(c.StartNodes({"a"}));
  EXPECT_NE(c.nodes[0]->Log().find(kWarning), std::string::npos) << c.nodes[0]->Log();
  c.nodes.clear();

  const int pinned = FreePort();
  ASSERT_GT(pinned, 0);
  const std::string range = std::to_string(pinned) + "-" + std::to_string(pinned);
  setenv("UCX_TCP_PORT_RANGE", range.c_str(), 1);
  const bool started = c.StartNodes({"a"});
  unsetenv("UCX_TCP_PORT_RANGE");
  ASSERT_TRUE(started);
  NodeProcess& a = *c.nodes[0];
  EXPECT_EQ(a.Log().find(kWarning), std::string::npos) << a.Log();
  std::set<int> ports;
  for (const Listener& l : ListeningSockets(a.pid())) ports.insert(l.port);
  EXPECT_TRUE(ports.contains(pinned)) << "UCX's listener is not on " << pinned;
  EXPECT_EQ(ports.size(), 3u);  // admin, peer and UCX's
}

TEST(PeerPort, KilledNodeRestartsOnItsPeerPortAtOnce) {
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  ASSERT_TRUE(c.StartNodes({"a", "b"}));
  kvpool_client* ca = OpenLocal(*c.nodes[0], /*copy_mode=*/true);
  ASSERT_NE(ca, nullptr);
  for (int round = 0; round < 3; ++round) {
    // Connections to b's peer port are open (a read through a) when it dies.
    auto ids = NumberedKeys("restart", "r" + std::to_string(round) + "-", 8);
    ByteValues vals;
    for (size_t i = 0; i < ids.size(); ++i) vals.push_back(Pattern(round * 100 + i, 1024));
    {
      kvpool_client* cb = OpenLocal(*c.nodes[1], /*copy_mode=*/true);
      ASSERT_NE(cb, nullptr);
      std::vector<kvpool_status> st(ids.size(), KVPOOL_OK);
      ASSERT_EQ(PutValues(cb, ids, vals, &st), KVPOOL_OK);
      ASSERT_TRUE(
          WaitFor(std::chrono::seconds(10), [&] { return AllHit(GetValues(ca, ids, 2048)); }));
      kvpool_close(cb);
    }
    c.nodes[1]->Stop(round == 0 ? SIGTERM : SIGKILL);
    auto t0 = std::chrono::steady_clock::now();
    std::string log;
    c.nodes[1] = NodeProcess::Start({"--node-id", "b", "--peers", c.members, "--peer-port",
                                     std::to_string(c.ports[1])},
                                    "", &log);
    ASSERT_NE(c.nodes[1], nullptr) << log;
    std::printf("RESTART round %d serving after %lld ms\n", round,
                static_cast<long long>(MsSince(t0)));
    // The new b serves its peers: a value put on it reads through a.
    kvpool_client* cb = OpenLocal(*c.nodes[1], /*copy_mode=*/true);
    ASSERT_NE(cb, nullptr);
    std::vector<kvpool_status> st(ids.size(), KVPOOL_OK);
    ASSERT_EQ(PutValues(cb, ids, vals, &st), KVPOOL_OK);
    ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] { return AllHit(GetValues(ca, ids, 2048)); }));
    ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(ca, ids, 2048), vals));
    kvpool_close(cb);
  }
  kvpool_close(ca);
}

// With --peer-idle-close, the connections two real nodes opened for a read
// close once no call uses them, on both nodes, and the next read through
// them connects again and is exact.
TEST(PeerPort, IdlePeerConnectionsCloseAndTheNextReadConnectsAgain) {
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  ASSERT_TRUE(c.StartNodes({"a", "b"}, {"--peer-idle-close", "1s", "--anti-entropy-interval", "0",
                                        "--read-replicas", "none"}));
  NodeProcess& a = *c.nodes[0];
  NodeProcess& b = *c.nodes[1];
  kvpool_client* ca = OpenLocal(a, /*copy_mode=*/true);
  kvpool_client* cb = OpenLocal(b, /*copy_mode=*/true);
  ASSERT_NE(ca, nullptr);
  ASSERT_NE(cb, nullptr);
  auto ids = NumberedKeys("idle", "k-", 8);
  ByteValues vals;
  for (size_t i = 0; i < ids.size(); ++i) vals.push_back(Pattern(700 + i, 4096));
  std::vector<kvpool_status> st(ids.size(), KVPOOL_OK);
  ASSERT_EQ(PutValues(cb, ids, vals, &st), KVPOOL_OK);
  ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] { return AllHit(GetValues(ca, ids, 8192)); }));
  ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(ca, ids, 8192), vals));
  EXPECT_GT(a.Metric("kvpool_transport_endpoints"), 0);
  auto all_closed = [&] {
    return a.Metric("kvpool_transport_endpoints") == 0 &&
           b.Metric("kvpool_transport_endpoints") == 0;
  };
  ASSERT_TRUE(WaitFor(std::chrono::seconds(10), all_closed))
      << "a " << a.Metric("kvpool_transport_endpoints") << ", b "
      << b.Metric("kvpool_transport_endpoints");
  // Either side may find the connection idle first (a's endpoint to b also
  // carries b's answers): the other sees the close as the peer's.
  EXPECT_GE(a.Metric("kvpool_transport_idle_closed_total") +
                b.Metric("kvpool_transport_idle_closed_total"),
            1);
  // The values are still on b, and a reads them through a new connection.
  kvpool_close(ca);
  ca = OpenLocal(a, /*copy_mode=*/true);  // a fresh client: nothing cached from the first read
  ASSERT_NE(ca, nullptr);
  const double fetched = a.Metric("kvpool_transport_calls_total{result=\"ok\"}");
  ASSERT_NO_FATAL_FAILURE(ExpectValues(GetValues(ca, ids, 8192), vals));
  EXPECT_GT(a.Metric("kvpool_transport_calls_total{result=\"ok\"}"), fetched);
  EXPECT_EQ(a.Metric("kvpool_transport_calls_total{result=\"unavailable\"}"), 0);
  kvpool_close(ca);
  kvpool_close(cb);
}

long RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

double Pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}
double P99(std::vector<double> v) { return Pct(std::move(v), 0.99); }


// A value put on b and read through a: the read is a remote fetch over the
// peer connection a holds to b. Returns the read's milliseconds (-1: miss).
double RemoteReadMs(kvpool_client* on_b, kvpool_client* on_a, const std::string& name) {
  auto id = NumberedKeys("slowpeer", name, 1);
  ByteValues v = {Pattern(std::hash<std::string>()(name), 16384)};
  std::vector<kvpool_status> st(1, KVPOOL_OK);
  if (PutValues(on_b, id, v, &st) != KVPOOL_OK || st[0] != KVPOOL_OK) return -1;
  // The directory publish is asynchronous: wait until the home knows.
  double ms = -1;
  testing::WaitFor(
      [&] {
        auto t0 = std::chrono::steady_clock::now();
        MaybeByteValues got = GetValues(on_a, id, 16384);
        if (!got[0]) return false;
        ms = *got[0] == v[0]
                 ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count()
                 : -1;
        return true;
      },
      std::chrono::seconds(2), std::chrono::milliseconds(2));
  return ms;
}

// 2,000 idle and 2,000 one-byte-every-2-s connections on b's peer port: the
// established peer connection a -> b keeps its latency, b's /healthz answers,
// a new peer gets in once the bootstrap slots free, the flood is reaped by the
// bootstrap deadline, and b's memory barely moves.
// The nodes hold a cluster key, as deployed off loopback, so the flood also
// has connections that stall inside the authentication handshake: a valid
// hello, the node's challenge, then silence.
TEST(PeerPort, IdleTricklingAndStalledConnectionsCostBoundedSlotsForABoundedTime) {
  rlimit rl{65536, 65536};
  setrlimit(RLIMIT_NOFILE, &rl);
  char tmpl[] = "/tmp/kvpool-flood-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string key_file = dir + "/cluster.key";
  {
    std::ofstream key(key_file);
    key << "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed\n";
  }
  ASSERT_EQ(chmod(key_file.c_str(), 0600), 0);
  auto keys = transport::LoadClusterKeyFile(key_file);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  ASSERT_TRUE(c.StartNodes({"a", "b"}, {"--cluster-key-file", key_file}));
  NodeProcess& b = *c.nodes[1];
  kvpool_client* ca = OpenLocal(*c.nodes[0], /*copy_mode=*/true);
  kvpool_client* cb = OpenLocal(b, /*copy_mode=*/true);
  ASSERT_NE(ca, nullptr);
  ASSERT_NE(cb, nullptr);
  // Gets per window. The p99 of a window is its 10th-slowest get: with fewer,
  // it is decided by three or four scheduler pauses of the shared cores.
  constexpr int kGets = 1000;
  std::vector<double> base, during;
  for (int i = 0; i < kGets; ++i) {
    double ms = RemoteReadMs(cb, ca, "base-" + std::to_string(i));
    ASSERT_GE(ms, 0) << i;
    base.push_back(ms);
  }
  long rss0 = RssKiB(b.pid());

  constexpr int kEach = 2000;
  std::vector<int> idle, trickle, stalled;
  transport::BootstrapMessage auth_hello;
  transport::AuthConnector intruder_with_key(keys->front(), "flood/1");
  auth_hello.body = *intruder_with_key.Hello();
  const std::vector<uint8_t> stall_bytes = transport::EncodeBootstrap(auth_hello);
  for (int i = 0; i < kEach; ++i) {
    int fd = DialLoopback(c.ports[1]);
    if (fd >= 0) idle.push_back(fd);
    fd = DialLoopback(c.ports[1]);
    if (fd < 0) continue;
    if (i % 2 == 0) {
      trickle.push_back(fd);
    } else {
      send(fd, stall_bytes.data(), stall_bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      stalled.push_back(fd);
    }
  }
  const std::vector<uint8_t> hello = transport::EncodeBootstrap({});
  std::atomic<bool> stop{false};
  // One byte of a hello every 2 s on each trickling connection (a valid
  // prefix, so the node can only wait for the rest or give up on it).
  std::thread trickler([&] {
    for (size_t byte = 0; byte < hello.size() && !stop; ++byte) {
      for (int fd : trickle) send(fd, &hello[byte], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      // Sleeps: real sockets: one byte every 2 s.
      for (int i = 0; i < 20 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto flood_t0 = std::chrono::steady_clock::now();
  std::vector<double> healthz;
  for (int i = 0; i < kGets; ++i) {
    double ms = RemoteReadMs(cb, ca, "flood-" + std::to_string(i));
    EXPECT_GE(ms, 0) << i;
    during.push_back(ms);
    auto t0 = std::chrono::steady_clock::now();
    int http = 0;
    b.HttpGet("/healthz", &http);
    EXPECT_EQ(http, 200);
    healthz.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  // A peer that connects now (a, killed and started again) reaches b once
  // the bootstrap slots free.
  kvpool_close(ca);
  c.nodes[0]->Stop(SIGKILL);
  std::string log;
  c.nodes[0] = NodeProcess::Start({"--node-id", "a", "--peers", c.members, "--peer-port",
                                    std::to_string(c.ports[0]), "--cluster-key-file", key_file},
                                   "", &log);
  ASSERT_NE(c.nodes[0], nullptr) << log;
  kvpool_client* cc = OpenLocal(*c.nodes[0], /*copy_mode=*/true);
  ASSERT_NE(cc, nullptr);
  double c_ms = -1;
  auto c_t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100 && c_ms < 0; ++i) c_ms = RemoteReadMs(cb, cc, "newpeer-" + std::to_string(i));
  double c_in_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c_t0).count();
  EXPECT_GE(c_ms, 0) << "a new peer never read through b";
  // Every flood connection is closed by b within its bootstrap deadline
  // (3 s) of its accept, plus the slack of one sweep.
  bool reaped = WaitFor(std::chrono::seconds(10), [&] {
    return b.Metric("kvpool_transport_bootstrapping") == 0;
  });
  double reaped_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - flood_t0).count();
  // Closed by b: a refusal's bytes (if any), then end of stream or a reset.
  // *challenged: connections whose first message from b was a challenge.
  auto closed_by_node = [](const std::vector<int>& fds, size_t* challenged) {
    size_t closed = 0;
    for (int fd : fds) {
      uint8_t buf[4096];
      std::vector<uint8_t> in;
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) in.insert(in.end(), buf, buf + n);
      closed += n == 0 || (n < 0 && errno == ECONNRESET);
      transport::BootstrapMessage m;
      size_t used = 0;
      const char* reason = "";
      if (transport::ParseBootstrap(in, &m, &used, &reason) == transport::BootstrapParse::kDone &&
          m.kind == transport::BootstrapKind::kChallenge) {
        ++*challenged;
      }
    }
    return closed;
  };
  size_t idle_challenged = 0, stalled_challenged = 0;
  size_t closed_by_b = closed_by_node(idle, &idle_challenged);
  size_t stalled_closed_by_b = closed_by_node(stalled, &stalled_challenged);
  long rss1 = RssKiB(b.pid());
  stop = true;
  trickler.join();
  for (int fd : idle) close(fd);
  for (int fd : trickle) close(fd);
  for (int fd : stalled) close(fd);
  int r = system(("rm -rf '" + dir + "'").c_str());
  (void)r;

  double refused = b.Metric("kvpool_transport_bootstrap_refused_total{reason=\"too_many_bootstrapping\"}");
  double timed_out = b.Metric("kvpool_transport_bootstrap_refused_total{reason=\"bootstrap_timeout\"}");
  std::sort(base.begin(), base.end());
  std::sort(during.begin(), during.end());
  std::printf("GETS base p50 %.3f p90 %.3f max %.3f; flood p50 %.3f p90 %.3f max %.3f\n",
              base[base.size() / 2], base[base.size() * 9 / 10], base.back(),
              during[during.size() / 2], during[during.size() * 9 / 10], during.back());
  std::printf("SUMMARY {\"flood\":%zu,\"remote_get_p99_ms\":{\"base\":%.3f,\"flood\":%.3f},"
              "\"healthz_p99_ms\":%.2f,\"new_peer_in_ms\":%.0f,\"reaped_all_ms\":%.0f,"
              "\"idle_closed_by_node\":%zu,\"stalled_in_handshake_closed_by_node\":%zu,"
              "\"stalled_challenged\":%zu,"
              "\"refused_at_accept\":%.0f,\"bootstrap_timeouts\":%.0f,\"rss_growth_kib\":%ld}\n",
              idle.size() + trickle.size() + stalled.size(), P99(base), P99(during), P99(healthz),
              c_in_ms, reaped_ms, closed_by_b, stalled_closed_by_b, stalled_challenged, refused, timed_out,
              rss1 - rss0);
  EXPECT_EQ(idle.size() + trickle.size() + stalled.size(), 2u * kEach);
  EXPECT_TRUE(reaped);
  EXPECT_EQ(closed_by_b, idle.size());
  EXPECT_EQ(stalled_closed_by_b, stalled.size());
  // Some stalled connections got as far as the challenge (the others were
  // refused at accept while the bootstrap slots were full); none got past
  // it, and no idle connection was challenged.
  EXPECT_GT(stalled_challenged, 0u);
  EXPECT_EQ(idle_challenged, 0u);
  EXPECT_LE(b.Metric("kvpool_transport_bootstrap_refused_total{reason=\"bad_proof\"}"), 0);
  // Every flood connection was refused at accept or timed out in its
  // bootstrap (and the restarted a may have been refused a few times too).
  EXPECT_GE(refused + timed_out, 2.0 * kEach);
  EXPECT_LE(P99(healthz), 100.0);
  // Within 2x of the baseline at p90, with a 2 ms floor as in the local
  // socket's test: on a shared 2-core machine the flood's own kernel work
  // (4,000 connects, resets) lands on the same cores. The p99 of 1,000
  // sub-ms gets is their 10th slowest, which that noise alone moves past
  // 2 ms (2.09 ms seen under a parallel build); it is held to 10 ms, far
  // below what a starved port gives (the 3 s bootstrap deadline).
  EXPECT_LE(Pct(during, 0.9), std::max(2 * Pct(base, 0.9), 2.0));
  EXPECT_LE(P99(during), std::max(2 * P99(base), 10.0));
  EXPECT_LE(rss1 - rss0, 64 * 1024);
  kvpool_close(cc);
  kvpool_close(cb);
}

}  // namespace
}  // namespace kvpool::testing
