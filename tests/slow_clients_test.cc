// Slow, idle and greedy clients against a real kvpool-node, on the admin
// port and the Unix socket, and the socket's placement rules (squatting,
// links, world-writable directories, the server's uid, the default path).
// Figures (latency percentiles, RSS growth, reap times) are printed so a run
// documents them; the assertions are the acceptance bounds.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback_test_util.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "kvpool/kvpool.h"
#include "protocol/codec.h"
#include "testing/wait_for.h"

namespace kvpool {
namespace {

using SteadyClock = std::chrono::steady_clock;
using protocol::MessageType;

constexpr uid_t kNobody = 65534;

double MsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/kvpool-slow-XXXXXX";
  return mkdtemp(tmpl);
}

// Both ends of thousands of connections: the test's own descriptors, and
// (inherited) the node's hard limit, which it raises its soft limit to.
void RaiseFdLimit() {
  rlimit rl{65536, 65536};
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// A kvpool-node child process with its log in a file.
class Node {
 public:
  // Starts the node; when `uid` is set the child runs as that user, with
  // `env` added to its environment. Waits for the serving line or the exit.
  static std::unique_ptr<Node> Start(const std::string& dir, std::vector<std::string> args,
                                     uid_t uid = static_cast<uid_t>(-1),
                                     std::vector<std::string> env = {}) {
    auto n = std::unique_ptr<Node>(new Node());
    // A fresh log per start: a reader must never see an earlier node's lines.
    static int starts = 0;
    n->log_path_ = dir + "/node-" + std::to_string(++starts) + ".log";
    args.insert(args.begin(), {KVPOOL_NODE_BIN, "--dram-capacity", "64MiB", "--slab-size", "1MiB",
                               "--admin-port", "0", "--node-id", "slow-test", "--poll-spin-us",
                               "0"});
    n->pid_ = fork();
    if (n->pid_ == 0) {
      int fd = ::open(n->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
      dup2(fd, 1);
      dup2(fd, 2);
      if (uid != static_cast<uid_t>(-1) && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(126);
      for (auto& e : env) putenv(e.data());
      std::vector<char*> av;
      for (auto& a : args) av.push_back(a.data());
      av.push_back(nullptr);
      execv(av[0], av.data());
      _exit(127);
    }
    std::regex re("serving: socket (\\S+) .* admin http://[0-9.]+:([0-9]+)");
    // Serving (its log says where), or exited.
    testing::WaitFor(
        [&] {
          std::string text = ReadFile(n->log_path_);
          std::smatch m;
          if (std::regex_search(text, m, re)) {
            n->socket_ = m[1];
            n->admin_port_ = std::stoi(m[2]);
            n->serving_ = true;
            return true;
          }
          int st;
          if (waitpid(n->pid_, &st, WNOHANG) != n->pid_) return false;
          n->pid_ = -1;
          return true;
        },
        std::chrono::seconds(20), std::chrono::milliseconds(10));
    return n;
  }

  ~Node() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st;
      waitpid(pid_, &st, 0);
    }
  }

  bool serving() const { return serving_; }
  const std::string& socket() const { return socket_; }
  int admin_port() const { return admin_port_; }
  std::string Log() const { return ReadFile(log_path_); }

  // Resident set size in KiB (VmRSS), -1 when unknown.
  long RssKiB() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

 private:
  Node() = default;
  pid_t pid_ = -1;
  std::string log_path_;
  std::string socket_;
  int admin_port_ = 0;
  bool serving_ = false;
};


int DialUnix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads exactly n bytes within the deadline; false on EOF, error or time.
bool ReadExact(int fd, uint8_t* p, size_t n, SteadyClock::time_point until) {
  size_t got = 0;
  while (got < n) {
    pollfd pf{fd, POLLIN, 0};
    int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now()).count());
    if (ms <= 0 || ::poll(&pf, 1, ms) <= 0) return false;
    // Plain recv: a passed segment fd is discarded by the kernel.
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

struct Reply {
  bool ok = false;  // a frame arrived
  protocol::FrameHeader header;
  std::string message;  // error replies: the text
};

Reply ReadReply(int fd, std::chrono::milliseconds wait = std::chrono::milliseconds(3000)) {
  Reply r;
  auto until = SteadyClock::now() + wait;
  uint8_t h[protocol::kHeaderBytes];
  if (!ReadExact(fd, h, sizeof(h), until)) return r;
  if (!protocol::DecodeHeader(std::span(h, sizeof(h)), 1u << 20, &r.header).ok()) return r;
  std::vector<uint8_t> body(r.header.body_len);
  if (!ReadExact(fd, body.data(), body.size(), until)) return r;
  if ((r.header.type & ~protocol::kReplyBit) == static_cast<uint16_t>(MessageType::kError)) {
    protocol::DecodeString(body, &r.message).IgnoreError();
  }
  r.ok = true;
  return r;
}

// Connects and says hello. Returns the fd and sets *reply.
int HelloConnection(const std::string& socket, Reply* reply) {
  int fd = DialUnix(socket);
  if (fd < 0) return -1;
  std::vector<uint8_t> body;
  protocol::HelloRequest hello;
  hello.client_name = "slow-test";
  protocol::EncodeHello(hello, &body);
  auto f = protocol::EncodeFrame(MessageType::kHello, 7, 0, body, false);
  // The node may have refused (and closed) already: its reply still waits.
  ssize_t w = ::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
  (void)w;
  *reply = ReadReply(fd);
  return fd;
}

double HealthzMs(int port) {
  auto t0 = SteadyClock::now();
  int fd = testing::DialLoopback(port);
  if (fd < 0) return 1e9;
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  ssize_t w = ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  (void)w;
  std::string resp;
  char buf[512];
  auto until = t0 + std::chrono::seconds(5);
  while (SteadyClock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) break;
    resp.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  double ms = MsSince(t0);
  return resp.rfind("HTTP/1.1 200 OK\r\n", 0) == 0 && resp.ends_with("\r\n\r\nok") ? ms : 1e9;
}

// One series line's value from /metrics, or -1.
double Metric(int port, const std::string& series) {
  int fd = testing::DialLoopback(port);
  if (fd < 0) return -1;
  const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
  ssize_t w = ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  (void)w;
  std::string resp;
  char buf[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) break;
    resp.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  size_t at = resp.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(resp.substr(at + series.size() + 2));
}

kvpool_client* OpenClient(const std::string& socket, kvpool_status* st,
                          int64_t expected_uid = -1) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = socket.empty() ? nullptr : socket.c_str();
  o.max_connections = 1;
  o.timeout_ms = 3000;
  o.expected_server_uid = expected_uid;
  return kvpool_open(&o, st);
}

kvpool_key_id KeyOf(int i) {
  std::string k = "key-" + std::to_string(i);
  const void* kp = k.data();
  size_t len = k.size();
  kvpool_key_id id;
  kvpool_key_ids("slow", 4, &kp, &len, 1, &id);
  return id;
}

// Times one small get; -1 on failure.
double GetMs(kvpool_client* c, int i) {
  char buf[4096];
  void* bp = buf;
  uint64_t cap = sizeof(buf), size = 0;
  kvpool_status item;
  kvpool_key_id id = KeyOf(i);
  auto t0 = SteadyClock::now();
  kvpool_status st = kvpool_get(c, &id, &bp, &cap, 1, &size, &item);
  double ms = MsSince(t0);
  return st == KVPOOL_OK && item == KVPOOL_OK && size == sizeof(buf) ? ms : -1;
}

void PutKeys(kvpool_client* c, int n) {
  std::vector<char> value(4096, 'v');
  for (int i = 0; i < n; ++i) {
    kvpool_key_id id = KeyOf(i);
    const void* vp = value.data();
    uint64_t size = value.size();
    kvpool_status item;
    ASSERT_EQ(kvpool_put(c, &id, &vp, &size, 1, &item), KVPOOL_OK) << kvpool_last_error();
  }
}

class SlowClientsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RaiseFdLimit();
    dir_ = MakeTempDir();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// 2,000 idle and 2,000 trickling connections on each of the admin port and
// the Unix socket, while a client keeps reading and a probe polls /healthz.
TEST_F(SlowClientsTest, HealthAndClientsHoldUnderIdleAndTricklingConnections) {
  constexpr int kEach = 2000;
  constexpr int kLocalCap = 512;
  // One uid floods the node's own cap (the per-uid cap is tenant_test's).
  auto node = Node::Start(dir_, {"--socket", dir_ + "/node.sock", "--max-connections",
                                 std::to_string(kLocalCap), "--max-connections-per-uid",
                                 std::to_string(kLocalCap), "--idle-timeout", "2s",
                                 "--frame-timeout", "3s", "--handshake-timeout", "3s",
                                 "--admin-request-timeout", "2s", "--admin-max-connections",
                                 "8192"});
  ASSERT_TRUE(node->serving()) << node->Log();
  const int port = node->admin_port();
  kvpool_status st;
  kvpool_client* reader = OpenClient(node->socket(), &st);
  ASSERT_NE(reader, nullptr) << kvpool_last_error();
  PutKeys(reader, 64);
  std::vector<double> base_ms, base_health;
  for (int i = 0; i < 400; ++i) base_ms.push_back(GetMs(reader, i % 64));
  for (int i = 0; i < 20; ++i) base_health.push_back(HealthzMs(port));
  ASSERT_GT(*std::min_element(base_ms.begin(), base_ms.end()), 0);
  const long rss0 = node->RssKiB();

  // ---- the flood ----
  std::vector<int> admin_idle, admin_trickle, local_idle, local_trickle;
  std::map<int, SteadyClock::time_point> opened;  // fd -> when its deadline clock started
  int refused = 0, refused_explicit = 0;
  const auto flood_start = SteadyClock::now();
  for (int i = 0; i < kEach; ++i) {
    int a = testing::DialLoopback(port), b = testing::DialLoopback(port);
    ASSERT_GE(a, 0);
    ASSERT_GE(b, 0);
    ASSERT_EQ(::send(b, "G", 1, MSG_NOSIGNAL), 1);
    opened[a] = opened[b] = SteadyClock::now();
    admin_idle.push_back(a);
    admin_trickle.push_back(b);
  }
  for (int i = 0; i < 2 * kEach; ++i) {
    Reply r;
    int fd = HelloConnection(node->socket(), &r);
    ASSERT_GE(fd, 0);
    if (r.ok && r.header.status == 0) {
      opened[fd] = SteadyClock::now();
      if (i % 2 == 0) {
        local_idle.push_back(fd);
      } else {
        // A frame begun: its header's first byte.
        ASSERT_EQ(::send(fd, "K", 1, MSG_NOSIGNAL), 1);
        local_trickle.push_back(fd);
      }
      continue;
    }
    ++refused;
    if (r.ok && r.header.request_id == 0 &&
        r.header.status == static_cast<int32_t>(StatusCode::kResourceExhausted) &&
        r.message.rfind("too many connections", 0) == 0) {
      ++refused_explicit;
    }
    ::close(fd);
  }
  const double flood_ms = MsSince(flood_start);
  // The cap, less the reader's connection, was served; every other
  // connection was told why it was refused.
  EXPECT_EQ(static_cast<int>(local_idle.size() + local_trickle.size()), kLocalCap - 1);
  EXPECT_EQ(refused, 2 * kEach - (kLocalCap - 1));
  EXPECT_EQ(refused_explicit, refused);

  // A new client while the cap is reached: refused, and told why.
  kvpool_client* late = OpenClient(node->socket(), &st);
  EXPECT_EQ(late, nullptr);
  EXPECT_EQ(st, KVPOOL_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(kvpool_last_error()).find("too many connections"), std::string::npos)
      << kvpool_last_error();

  // ---- under load: probe, read, trickle, and watch connections close ----
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::map<int, int> kind;  // 0 admin idle, 1 admin trickle, 2 local idle, 3 local trickle
  for (int fd : admin_idle) kind[fd] = 0;
  for (int fd : admin_trickle) kind[fd] = 1;
  for (int fd : local_idle) kind[fd] = 2;
  for (int fd : local_trickle) kind[fd] = 3;
  for (auto& [fd, k] : kind) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  std::map<int, double> closed_after_ms;  // fd -> ms from its clock start to close
  std::map<int, std::string> last_words;  // local fds: the node's connection error
  std::vector<double> load_ms, health_ms;
  long rss_peak = rss0;
  kvpool_client* newcomer = nullptr;
  auto next_trickle = SteadyClock::now() + std::chrono::seconds(2);
  const auto watch_until = SteadyClock::now() + std::chrono::seconds(6);
  while (SteadyClock::now() < watch_until && closed_after_ms.size() < kind.size()) {
    health_ms.push_back(HealthzMs(port));
    for (int i = 0; i < 10; ++i) load_ms.push_back(GetMs(reader, i));
    rss_peak = std::max(rss_peak, node->RssKiB());
    if (SteadyClock::now() >= next_trickle) {
      for (auto& [fd, k] : kind) {
        if ((k == 1 || k == 3) && !closed_after_ms.count(fd)) {
          ssize_t w = ::send(fd, k == 1 ? "E" : "P", 1, MSG_NOSIGNAL);
          (void)w;
        }
      }
      next_trickle += std::chrono::seconds(2);
    }
    epoll_event evs[512];
    int n = epoll_wait(ep, evs, 512, 10);
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (kind[fd] >= 2) {
        Reply r = ReadReply(fd, std::chrono::milliseconds(200));
        if (r.ok) last_words[fd] = r.message;
      }
      char b[256];
      while (::recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0) {
      }
      closed_after_ms[fd] = MsSince(opened[fd]);
      epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    }
    // Once the idle ones are reaped, a new client gets a slot.
    if (newcomer == nullptr && MsSince(flood_start) > flood_ms + 2600) {
      newcomer = OpenClient(node->socket(), &st);
      EXPECT_NE(newcomer, nullptr) << kvpool_last_error();
      if (newcomer != nullptr) {
        EXPECT_GT(GetMs(newcomer, 1), 0);
      }
    }
  }
  ::close(ep);

  // Every slow connection was closed, each by its own deadline.
  EXPECT_EQ(closed_after_ms.size(), kind.size());
  std::vector<double> reap[4];
  for (auto& [fd, ms] : closed_after_ms) reap[kind[fd]].push_back(ms);
  const double limit_ms[4] = {2000, 2000, 2000, 3000};
  const char* names[4] = {"admin idle", "admin trickle", "local idle", "local trickle"};
  for (int k = 0; k < 4; ++k) {
    ASSERT_FALSE(reap[k].empty()) << names[k];
    double lo = *std::min_element(reap[k].begin(), reap[k].end());
    double hi = *std::max_element(reap[k].begin(), reap[k].end());
    std::printf("%-14s n=%4zu closed after %.0f..%.0f ms (deadline %.0f ms)\n", names[k],
                reap[k].size(), lo, hi, limit_ms[k]);
    EXPECT_GE(lo, limit_ms[k] - 50) << names[k];
    // The node checks deadlines at least every 0.5 s.
    EXPECT_LE(hi, limit_ms[k] + 1000) << names[k];
  }
  for (int fd : local_idle) {
    EXPECT_EQ(last_words[fd], "connection idle for 2000 ms; closed by the node");
  }
  for (int fd : local_trickle) {
    EXPECT_EQ(last_words[fd], "a frame was not completed within 3000 ms; connection closed");
  }
  for (auto& [fd, k] : kind) ::close(fd);

  const double base_p99 = Percentile(base_ms, 0.99);
  const double load_p99 = Percentile(load_ms, 0.99);
  const double health_p99 = Percentile(health_ms, 0.99);
  const double rss_growth_mib = static_cast<double>(rss_peak - rss0) / 1024.0;
  std::printf(
      "flood of %d connections opened in %.0f ms; /healthz p50 %.2f p99 %.2f max %.2f ms "
      "(n=%zu; before: p99 %.2f)\nreader get p50 %.3f p99 %.3f ms (n=%zu) vs baseline p50 %.3f "
      "p99 %.3f ms\nnode RSS %ld KiB -> peak %ld KiB (+%.1f MiB)\n",
      4 * kEach, flood_ms, Percentile(health_ms, 0.5), health_p99,
      *std::max_element(health_ms.begin(), health_ms.end()), health_ms.size(),
      Percentile(base_health, 0.99), Percentile(load_ms, 0.5), load_p99, load_ms.size(),
      Percentile(base_ms, 0.5), base_p99, rss0, rss_peak, rss_growth_mib);
  EXPECT_LE(health_p99, 100.0);
  EXPECT_GT(*std::min_element(load_ms.begin(), load_ms.end()), 0) << "a get failed under load";
  // The outcome: the reader is never made to wait behind the slow
  // connections. A node that let them hold its loop would stall gets until
  // their 2-3 s deadlines; a served get takes well under a millisecond. The
  // bound sits far from both so that scheduler noise on a shared machine
  // cannot decide it; the printed p50/p99 against the baseline are the
  // measurement, not a pass mark.
  EXPECT_LE(load_p99, 50.0);
  EXPECT_LE(rss_growth_mib, 64.0);

  EXPECT_EQ(Metric(port, "kvpool_local_connections_reaped_total{reason=\"idle\"}"),
            static_cast<double>(local_idle.size()));
  EXPECT_EQ(Metric(port, "kvpool_local_connections_reaped_total{reason=\"frame_timeout\"}"),
            static_cast<double>(local_trickle.size()));
  EXPECT_EQ(Metric(port, "kvpool_rejected_connections_total"), refused + 1.0);
  EXPECT_EQ(Metric(port, "kvpool_admin_connections_timed_out_total"), 2.0 * kEach);
  if (newcomer != nullptr) kvpool_close(newcomer);
  kvpool_close(reader);
}

// Connections that announce large bodies and send only part hold at most
// the node-wide buffer budget, and a small client is still served.
TEST_F(SlowClientsTest, AnnouncedBodiesCannotTakeMoreThanTheBufferBudget) {
  auto node = Node::Start(dir_, {"--socket", dir_ + "/node.sock", "--max-value-size", "8MiB",
                                 "--max-frame", "17MiB", "--max-buffered", "40MiB",
                                 "--frame-timeout", "2s", "--max-connections-per-uid", "256"});
  ASSERT_TRUE(node->serving()) << node->Log();
  const int port = node->admin_port();
  kvpool_status st;
  kvpool_client* small = OpenClient(node->socket(), &st);
  ASSERT_NE(small, nullptr) << kvpool_last_error();
  PutKeys(small, 4);
  const long rss0 = node->RssKiB();

  constexpr int kGreedy = 64;
  std::vector<int> greedy;
  const std::vector<uint8_t> chunk(256 * 1024, 0x5a);
  for (int i = 0; i < kGreedy; ++i) {
    Reply r;
    int fd = HelloConnection(node->socket(), &r);
    ASSERT_TRUE(r.ok && r.header.status == 0);
    // A put header announcing 16 MiB; the body follows below, 8 MiB of it.
    protocol::FrameHeader h;
    h.type = static_cast<uint16_t>(MessageType::kPut);
    h.request_id = 9;
    h.body_len = 16u << 20;
    uint8_t hb[protocol::kHeaderBytes];
    protocol::EncodeHeader(h, hb);
    ASSERT_EQ(::send(fd, hb, sizeof(hb), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(hb)));
    greedy.push_back(fd);
  }
  std::vector<size_t> sent(kGreedy, 0);
  long rss_peak = rss0;
  std::vector<double> small_ms;
  const auto t0 = SteadyClock::now();
  while (MsSince(t0) < 1500) {
    // Push what each socket takes without blocking, up to 8 MiB each: the
    // node reads as far as its budget allows.
    for (int i = 0; i < kGreedy; ++i) {
      while (sent[i] < (8u << 20)) {
        ssize_t w = ::send(greedy[i], chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) break;
        sent[i] += static_cast<size_t>(w);
      }
    }
    rss_peak = std::max(rss_peak, node->RssKiB());
    small_ms.push_back(GetMs(small, 1));
    // Sleeps: a real node: load paced while the slow clients sit.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  size_t total_sent = 0;
  for (size_t n : sent) total_sent += n;
  const double buffered = Metric(port, "kvpool_local_request_buffer_bytes");
  const double deferred = Metric(port, "kvpool_local_reads_deferred_total");
  // The frame timeout frees everything.
  int closed = 0;
  for (int fd : greedy) {
    Reply r = ReadReply(fd, std::chrono::milliseconds(4000));
    if (r.ok && r.message == "a frame was not completed within 2000 ms; connection closed") {
      ++closed;
    }
    ::close(fd);
  }
  const double growth_mib = static_cast<double>(rss_peak - rss0) / 1024.0;
  std::printf("64 x 16 MiB announced, %.0f MiB of bodies sent: node RSS +%.1f MiB, budget in "
              "use %.1f MiB, %g deferred reads; small get p99 %.3f ms\n",
              static_cast<double>(total_sent) / (1 << 20), growth_mib, buffered / (1 << 20),
              deferred, Percentile(small_ms, 0.99));
  EXPECT_LE(growth_mib, 64.0);
  EXPECT_LE(buffered, 40.0 * (1 << 20));
  EXPECT_GT(deferred, 0);
  EXPECT_GT(*std::min_element(small_ms.begin(), small_ms.end()), 0) << "a small get failed";
  EXPECT_EQ(closed, kGreedy);
  // The node closes the last of them just after their replies went out.
  double left = Metric(port, "kvpool_local_request_buffer_bytes");
  testing::WaitFor([&] { return (left = Metric(port, "kvpool_local_request_buffer_bytes")) == 0; },
                   std::chrono::seconds(1), std::chrono::milliseconds(10));
  EXPECT_EQ(left, 0);
  EXPECT_EQ(Metric(port, "kvpool_local_connections_reaped_total{reason=\"frame_timeout\"}"),
            kGreedy);
  kvpool_close(small);
}

// A connection holding a pin is not idle, however long it is quiet.
TEST_F(SlowClientsTest, ConnectionsHoldingPinsAreNotReapedAsIdle) {
  auto node = Node::Start(dir_, {"--socket", dir_ + "/node.sock", "--idle-timeout", "300ms"});
  ASSERT_TRUE(node->serving()) << node->Log();
  kvpool_status st;
  kvpool_client* c = OpenClient(node->socket(), &st);
  ASSERT_NE(c, nullptr) << kvpool_last_error();
  PutKeys(c, 1);
  kvpool_key_id id = KeyOf(0);
  kvpool_region region{};
  kvpool_status item;
  ASSERT_EQ(kvpool_acquire(c, &id, 1, &region, &item), KVPOOL_OK) << kvpool_last_error();
  // A pin keeps it through the idle reaper's rounds (every second; watched
  // for 1.2 s).
  EXPECT_FALSE(testing::WaitFor(
      [&] {
        return Metric(node->admin_port(),
                      "kvpool_local_connections_reaped_total{reason=\"idle\"}") != 0;
      },
      std::chrono::milliseconds(1200), std::chrono::milliseconds(50)));
  EXPECT_EQ(kvpool_release(c, &region.handle, 1), KVPOOL_OK);
  // Now the reaper (every second) closes it.
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        return Metric(node->admin_port(),
                      "kvpool_local_connections_reaped_total{reason=\"idle\"}") == 1;
      },
      std::chrono::milliseconds(5000), std::chrono::milliseconds(50)));
  // The client reconnects by itself on its next call.
  EXPECT_GT(GetMs(c, 0), 0) << kvpool_last_error();
  kvpool_close(c);
}

// ---- where the socket lives --------------------------------------------

class SocketPlacementTest : public SlowClientsTest {};

TEST_F(SocketPlacementTest, ForeignListenerAtThePathIsRefusedByName) {
  const std::string path = dir_ + "/node.sock";
  int squatter = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(squatter, 4), 0);
  auto node = Node::Start(dir_, {"--socket", path});
  EXPECT_FALSE(node->serving());
  EXPECT_NE(node->Log().find("cannot start: FailedPrecondition: another kvpool-node is serving " +
                             path + " (or some other process listens there)"),
            std::string::npos)
      << node->Log();
  ::close(squatter);
  // Now nothing serves it: the stale file is replaced.
  auto again = Node::Start(dir_, {"--socket", path});
  EXPECT_TRUE(again->serving()) << again->Log();
  EXPECT_NE(again->Log().find("replaced the stale socket " + path), std::string::npos);
}

TEST_F(SocketPlacementTest, SymlinkAtThePathOrAsTheDirectoryIsRefused) {
  const std::string target = dir_ + "/elsewhere.sock";
  const std::string link = dir_ + "/node.sock";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  auto node = Node::Start(dir_, {"--socket", link});
  EXPECT_FALSE(node->serving());
  EXPECT_NE(node->Log().find("socket path " + link +
                             " is a symbolic link; refusing to follow or replace it"),
            std::string::npos)
      << node->Log();
  EXPECT_FALSE(std::filesystem::exists(target));

  const std::string real = dir_ + "/real";
  const std::string linked_dir = dir_ + "/linked";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), linked_dir.c_str()), 0);
  auto node2 = Node::Start(dir_, {"--socket", linked_dir + "/node.sock"});
  EXPECT_FALSE(node2->serving());
  EXPECT_NE(node2->Log().find("socket directory " + linked_dir + " is a symbolic link"),
            std::string::npos)
      << node2->Log();
}

TEST_F(SocketPlacementTest, WorldWritableDirectoryNeedsTheSetting) {
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 01777), 0);
  auto node = Node::Start(dir_, {"--socket", open_dir + "/node.sock"});
  EXPECT_FALSE(node->serving());
  EXPECT_NE(node->Log().find("socket directory " + open_dir + " is world-writable"),
            std::string::npos)
      << node->Log();
  auto allowed = Node::Start(dir_, {"--socket", open_dir + "/node.sock",
                                    "--socket-allow-world-writable-dir"});
  EXPECT_TRUE(allowed->serving()) << allowed->Log();
}

// A listener that runs as another uid than the socket directory's owner
// (nobody, in a root-owned directory) is refused before anything is sent.
TEST_F(SocketPlacementTest, ClientRefusesAServerOfTheWrongUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as nobody";
  const std::string path = dir_ + "/node.sock";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    // Bound as root in the root-owned directory, listening as nobody: the
    // credentials a client sees are the listener's at listen().
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) _exit(1);
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(2);
    if (::listen(fd, 4) != 0) _exit(3);
    ssize_t w = ::write(ready[1], "x", 1);
    (void)w;
    int c = ::accept(fd, nullptr, nullptr);
    char b[64];
    // Records whether the client sent anything (it must not).
    ssize_t got = c >= 0 ? ::recv(c, b, sizeof(b), 0) : -1;
    _exit(got > 0 ? 10 : 0);
  }
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1);
  kvpool_status st;
  kvpool_client* c = OpenClient(path, &st);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(st, KVPOOL_FAILED_PRECONDITION);
  const std::string err = kvpool_last_error();
  EXPECT_NE(err.find("refusing the server at " + path + ": it runs as uid 65534"),
            std::string::npos)
      << err;
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the client sent bytes";
  ::close(ready[0]);
  ::close(ready[1]);

  // An explicit expected uid is checked exactly, against the real node too.
  auto node = Node::Start(dir_, {"--socket", dir_ + "/real.sock"});
  ASSERT_TRUE(node->serving()) << node->Log();
  kvpool_client* wrong = OpenClient(node->socket(), &st, 12345);
  EXPECT_EQ(wrong, nullptr);
  EXPECT_NE(std::string(kvpool_last_error()).find("not the expected uid 12345"), std::string::npos)
      << kvpool_last_error();
  kvpool_client* right = OpenClient(node->socket(), &st, 0);
  EXPECT_NE(right, nullptr) << kvpool_last_error();
  if (right != nullptr) kvpool_close(right);
}

// Without root the node falls back to $XDG_RUNTIME_DIR/kvpool, then to a
// private /tmp/kvpool-<uid>; a client with no socket configured finds it.
TEST_F(SocketPlacementTest, DefaultLocationFallsBackWithoutRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the node as nobody";
  const std::string xdg = dir_ + "/xdg";
  ASSERT_EQ(::mkdir(xdg.c_str(), 0700), 0);
  ASSERT_EQ(::chown(xdg.c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);  // nobody reaches xdg through it
  auto node = Node::Start(dir_, {}, kNobody, {"XDG_RUNTIME_DIR=" + xdg});
  ASSERT_TRUE(node->serving()) << node->Log();
  EXPECT_EQ(node->socket(), xdg + "/kvpool/kvpool.sock");
  struct stat st_dir;
  ASSERT_EQ(::lstat((xdg + "/kvpool").c_str(), &st_dir), 0);
  EXPECT_EQ(st_dir.st_mode & 07777, 0700u);
  EXPECT_EQ(st_dir.st_uid, kNobody);
  // The client's default search finds it (unless a node serves /run/kvpool).
  struct stat run_sock;
  if (::lstat("/run/kvpool/kvpool.sock", &run_sock) != 0) {
    // As nobody (the directory's owner: a per-user directory serves only
    // its own user), in a child.
    pid_t child = fork();
    if (child == 0) {
      if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(2);
      ::setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
      kvpool_status st;
      kvpool_client* c = OpenClient("", &st);
      if (c == nullptr) {
        std::fprintf(stderr, "%s\n", kvpool_last_error());
        _exit(1);
      }
      kvpool_close(c);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    // Root's own client is refused: the directory is nobody's, not root's.
    ::setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
    kvpool_status st;
    kvpool_client* c = OpenClient("", &st);
    ::unsetenv("XDG_RUNTIME_DIR");
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::string(kvpool_last_error()).find("is a per-user socket directory and must be "
                                                    "owned by this user (uid 0)"),
              std::string::npos)
        << kvpool_last_error();
    if (c != nullptr) kvpool_close(c);
  }
  node.reset();

  // No XDG_RUNTIME_DIR: a private directory under /tmp.
  const std::string tmp_dir = "/tmp/kvpool-" + std::to_string(kNobody);
  std::filesystem::remove_all(tmp_dir);
  auto fallback = Node::Start(dir_, {}, kNobody, {"XDG_RUNTIME_DIR="});
  ASSERT_TRUE(fallback->serving()) << fallback->Log();
  EXPECT_EQ(fallback->socket(), tmp_dir + "/kvpool.sock");
  ASSERT_EQ(::lstat(tmp_dir.c_str(), &st_dir), 0);
  EXPECT_EQ(st_dir.st_mode & 07777, 0700u);
  fallback.reset();
  std::filesystem::remove_all(tmp_dir);

  // The same directory made by someone else is refused, not used.
  ASSERT_EQ(::mkdir(tmp_dir.c_str(), 0700), 0);  // owned by root, not nobody
  auto squatted = Node::Start(dir_, {}, kNobody, {"XDG_RUNTIME_DIR="});
  EXPECT_FALSE(squatted->serving());
  EXPECT_NE(squatted->Log().find("socket directory " + tmp_dir + " must be owned by uid 65534"),
            std::string::npos)
      << squatted->Log();
  std::filesystem::remove_all(tmp_dir);
}

}  // namespace
}  // namespace kvpool
