// Connection lifecycle against the real node: a killed client's pins and
// reservations are released, clients reconnect after a node restart, a
// missing node is a fast error, connection limits and handshake deadlines.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "testing/wait_for.h"

namespace kvpool::testing {
namespace {

kvpool_client* Open(const std::string& socket, uint32_t timeout_ms = 5000) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = socket.c_str();
  o.max_connections = 2;
  o.timeout_ms = timeout_ms;
  kvpool_status st;
  return kvpool_open(&o, &st);
}

nlohmann::json Stats(const NodeProcess& n) {
  return nlohmann::json::parse(n.HttpGet("/api/v1/status"));
}

// Polls fn until it is true or 10 s pass (the node notices a closed
// connection asynchronously).
template <typename Fn>
bool Eventually(Fn fn) {
  return testing::WaitFor(std::move(fn), std::chrono::seconds(10), std::chrono::milliseconds(10));
}

// The state letter of /proc/PID/stat ('R', 'S', 'T' for stopped, ...).
char ProcessState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < line.size() ? line[close_paren + 2]
                                                                           : '?';
}

int RawConnect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(ClientLifecycle, KilledClientReleasesPinsAndReservations) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  {
    kvpool_client* c = Open(node->socket());
    ASSERT_NE(c, nullptr);
    auto v = Pattern(1, 10000);
    for (int i = 0; i < 10; ++i) {
      kvpool_key_id id = Client::KeyId("kill", std::to_string(i));
      const void* p = v.data();
      uint64_t size = v.size();
      kvpool_status st;
      ASSERT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_OK);
    }
    kvpool_close(c);
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    kvpool_client* c = Open(node->socket());
    if (c == nullptr) _exit(1);
    std::vector<kvpool_key_id> ids;
    for (int i = 0; i < 10; ++i) ids.push_back(Client::KeyId("kill", std::to_string(i)));
    std::vector<kvpool_region> r(10);
    std::vector<kvpool_status> st(10);
    if (kvpool_acquire(c, ids.data(), 10, r.data(), st.data()) != KVPOOL_OK) _exit(1);
    std::vector<kvpool_key_id> fresh;
    std::vector<uint64_t> sizes(5, 4096);
    for (int i = 0; i < 5; ++i) fresh.push_back(Client::KeyId("kill-new", std::to_string(i)));
    if (kvpool_reserve(c, fresh.data(), sizes.data(), 5, r.data(), st.data()) != KVPOOL_OK) _exit(1);
    char b = 'x';
    if (write(ready[1], &b, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char b;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  close(ready[0]);
  auto held = Stats(*node);
  EXPECT_EQ(held["dram"]["pinned"], 10);
  EXPECT_EQ(held["dram"]["reserved"], 5);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(Eventually([&] {
    auto s = Stats(*node);
    return s["dram"]["pinned"] == 0 && s["dram"]["reserved"] == 0 && s["local_connections"] == 0;
  })) << Stats(*node).dump();
  // Nothing stored was lost; aborted reservations never became visible.
  kvpool_client* c = Open(node->socket());
  ASSERT_NE(c, nullptr);
  std::vector<kvpool_key_id> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(Client::KeyId("kill", std::to_string(i)));
  ids.push_back(Client::KeyId("kill-new", "0"));
  uint8_t hits[11];
  size_t prefix;
  ASSERT_EQ(kvpool_exists(c, ids.data(), 11, hits, &prefix), KVPOOL_OK);
  EXPECT_EQ(prefix, 10u);
  EXPECT_EQ(hits[10], 0);
  kvpool_close(c);
}

TEST(ClientLifecycle, ReconnectsAfterNodeRestart) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  std::string socket = node->socket();
  std::string keep_dir = node->dir();
  kvpool_client* c = Open(socket);
  ASSERT_NE(c, nullptr);
  auto v = Pattern(3, 70000);
  kvpool_key_id id = Client::KeyId("restart", "a");
  const void* p = v.data();
  uint64_t size = v.size();
  kvpool_status st;
  ASSERT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_OK);
  // Hold a pin across the restart: its bytes must stay readable.
  kvpool_region pinned;
  ASSERT_EQ(kvpool_acquire(c, &id, 1, &pinned, &st), KVPOOL_OK);
  ASSERT_EQ(st, KVPOOL_OK);

  node->Stop(SIGTERM);
  uint8_t hit = 7;
  EXPECT_EQ(kvpool_exists(c, &id, 1, &hit, nullptr), KVPOOL_UNAVAILABLE);

  auto node2 = NodeProcess::Start({}, socket);
  ASSERT_NE(node2, nullptr);
  // The same client works again: the DRAM tier starts empty, so a miss...
  ASSERT_EQ(kvpool_exists(c, &id, 1, &hit, nullptr), KVPOOL_OK);
  EXPECT_EQ(hit, 0);
  // ...then a put and a byte-exact get through the new segment.
  ASSERT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_OK);
  std::vector<uint8_t> out(size);
  void* b = out.data();
  uint64_t got;
  ASSERT_EQ(kvpool_get(c, &id, &b, &size, 1, &got, &st), KVPOOL_OK);
  ASSERT_EQ(st, KVPOOL_OK);
  EXPECT_EQ(out, v);
  EXPECT_EQ(0, memcmp(pinned.data, v.data(), v.size()));
  EXPECT_EQ(kvpool_release(c, &pinned.handle, 1), KVPOOL_OK);  // a handle of the old node
  kvpool_close(c);
}

// One get of `id` into a buffer; 1 when it returned exactly `want`, 0 when
// it returned other bytes; -1 when the call failed.
int GetIs(kvpool_client* c, const kvpool_key_id& id, const std::vector<uint8_t>& want) {
  std::vector<uint8_t> buf(want.size() + 64);
  void* b = buf.data();
  uint64_t cap = buf.size(), size = 0;
  kvpool_status item = KVPOOL_OK;
  if (kvpool_get(c, &id, &b, &cap, 1, &size, &item) != KVPOOL_OK || item != KVPOOL_OK) return -1;
  return size == want.size() && std::memcmp(buf.data(), want.data(), size) == 0 ? 1 : 0;
}

// A client of `node` with these settings (the socket's string must outlive
// the open only: the library keeps its own copies).
kvpool_client* OpenWith(const NodeProcess& node, uint32_t max_connections,
                        uint32_t after_fork = KVPOOL_AFTER_FORK_RECONNECT) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = node.socket().c_str();
  o.max_connections = max_connections;
  o.after_fork = after_fork;
  kvpool_status st;
  return kvpool_open(&o, &st);
}

// A client opened before fork() and used by parent and child at once, on
// one connection (max_connections 1): each process gets only its own
// replies. The child's calls go over connections of its own; the parent's
// are untouched. 10 forks, 3,000 gets each side.
TEST(ClientLifecycle, AClientUsedAcrossForkNeverReturnsAnotherRequestsBytes) {
  std::string log;
  auto node = NodeProcess::Start({}, "", &log);
  ASSERT_NE(node, nullptr) << log;
  kvpool_client* c = OpenWith(*node, 1);
  ASSERT_NE(c, nullptr) << kvpool_last_error();
  kvpool_key_id ids[2];
  const void* keys[2] = {"a", "b"};
  size_t lens[2] = {1, 1};
  kvpool_key_ids("fork", 4, keys, lens, 2, ids);
  const std::vector<uint8_t> va = Pattern(11, 4096), vb = Pattern(22, 4096);
  const void* vals[2] = {va.data(), vb.data()};
  uint64_t sizes[2] = {va.size(), vb.size()};
  kvpool_status items[2];
  ASSERT_EQ(kvpool_put(c, ids, vals, sizes, 2, items), KVPOOL_OK);
  const double accepted_before = node->Metric("kvpool_accepted_connections_total");
  constexpr int kForks = 10, kGets = 3000;
  int parent_wrong = 0, parent_errors = 0, child_wrong = 0, child_errors = 0, children_ok = 0;
  for (int f = 0; f < kForks; ++f) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(p[0]);
      int counts[2] = {0, 0};  // wrong, errors
      for (int i = 0; i < kGets; ++i) {
        int r = GetIs(c, ids[1], vb);
        counts[0] += r == 0;
        counts[1] += r < 0;
      }
      kvpool_close(c);  // the child's part only
      ssize_t w = write(p[1], counts, sizeof(counts));
      _exit(w == sizeof(counts) ? 0 : 1);
    }
    close(p[1]);
    for (int i = 0; i < kGets; ++i) {
      int r = GetIs(c, ids[0], va);
      parent_wrong += r == 0;
      parent_errors += r < 0;
    }
    int counts[2] = {-1, -1};
    ASSERT_EQ(read(p[0], counts, sizeof(counts)), static_cast<ssize_t>(sizeof(counts)));
    close(p[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    children_ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    child_wrong += counts[0];
    child_errors += counts[1];
  }
  std::printf("metric fork_wrong_values %d\n", parent_wrong + child_wrong);
  EXPECT_EQ(children_ok, kForks);
  EXPECT_EQ(parent_wrong, 0);
  EXPECT_EQ(child_wrong, 0);
  EXPECT_EQ(parent_errors, 0) << kvpool_last_error();
  EXPECT_EQ(child_errors, 0);
  // Each child opened a connection of its own (and the parent none).
  EXPECT_EQ(node->Metric("kvpool_accepted_connections_total") - accepted_before, kForks);
  EXPECT_EQ(GetIs(c, ids[1], vb), 1);  // the parent's client goes on
  kvpool_close(c);
}

// KVPOOL_AFTER_FORK_FAIL: a child's calls on a client opened before fork()
// fail with FAILED_PRECONDITION and touch nothing; the parent is unaffected.
TEST(ClientLifecycle, AfterForkFailRefusesTheChildsCalls) {
  std::string log;
  auto node = NodeProcess::Start({}, "", &log);
  ASSERT_NE(node, nullptr) << log;
  kvpool_client* c = OpenWith(*node, 8, KVPOOL_AFTER_FORK_FAIL);
  ASSERT_NE(c, nullptr) << kvpool_last_error();
  kvpool_key_id id;
  const void* key = "k";
  size_t len = 1;
  kvpool_key_ids("fork", 4, &key, &len, 1, &id);
  const std::vector<uint8_t> v = Pattern(33, 1000);
  const void* vp = v.data();
  uint64_t size = v.size();
  kvpool_status item;
  ASSERT_EQ(kvpool_put(c, &id, &vp, &size, 1, &item), KVPOOL_OK);
  const double accepted_before = node->Metric("kvpool_accepted_connections_total");
  const std::string got = InChild([&] {
    std::vector<uint8_t> buf(2000);
    void* b = buf.data();
    uint64_t cap = buf.size(), size_got = 0;
    kvpool_status s = kvpool_get(c, &id, &b, &cap, 1, &size_got, &item);
    std::string out = std::string(kvpool_status_name(s)) + "|" + kvpool_last_error();
    kvpool_close(c);
    return out;
  });
  EXPECT_EQ(got.substr(0, got.find('|')), "FailedPrecondition") << got;
  EXPECT_NE(got.find("opened before fork()"), std::string::npos) << got;
  EXPECT_EQ(node->Metric("kvpool_accepted_connections_total"), accepted_before);
  EXPECT_EQ(GetIs(c, id, v), 1);
  kvpool_close(c);
}

// A handle the parent got before fork() means nothing in the child: the
// child's own connection starts its handles over, and a parent's handle
// released there must not release the child's own pin of the same number.
TEST(ClientLifecycle, AParentsHandleReleasedInTheChildLeavesTheChildsPin) {
  std::string log;
  auto node = NodeProcess::Start({}, "", &log);
  ASSERT_NE(node, nullptr) << log;
  kvpool_client* c = OpenWith(*node, 1);
  ASSERT_NE(c, nullptr) << kvpool_last_error();
  kvpool_key_id id, other;
  const void* keys[2] = {"pinned", "others"};
  size_t lens[2] = {6, 6};
  kvpool_key_id ids[2];
  kvpool_key_ids("fork", 4, keys, lens, 2, ids);
  id = ids[0];
  other = ids[1];
  const std::vector<uint8_t> v = Pattern(44, 8192);
  const void* vals[2] = {v.data(), v.data()};
  uint64_t sizes[2] = {v.size(), v.size()};
  kvpool_status items[2], item;
  // Written by another client: c's first handle is its acquire's, the same
  // number the child's first acquire gets on its own new connection.
  kvpool_client* w = OpenWith(*node, 1);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(kvpool_put(w, ids, vals, sizes, 2, items), KVPOOL_OK);
  kvpool_close(w);
  kvpool_region parent{};
  ASSERT_EQ(kvpool_acquire(c, &id, 1, &parent, &item), KVPOOL_OK);
  ASSERT_EQ(item, KVPOOL_OK);
  auto pinned = [&] { return Stats(*node)["dram"]["pinned"].get<int>(); };
  ASSERT_EQ(pinned(), 1);
  const std::string got = InChild([&] {
    kvpool_region mine{};
    kvpool_status it = KVPOOL_OK;
    if (kvpool_acquire(c, &other, 1, &mine, &it) != KVPOOL_OK || it != KVPOOL_OK) {
      return std::string("acquire failed");
    }
    const int both = pinned();  // the parent's entry and the child's
    kvpool_release(c, &parent.handle, 1);  // the parent's handle: not the child's pin
    // A release is one-way; a call answered after it on the same
    // connection was handled after it.
    uint8_t hit = 0;
    size_t prefix = 0;
    if (kvpool_exists(c, &other, 1, &hit, &prefix) != KVPOOL_OK)
      return std::string("exists failed");
    const int after = pinned();
    kvpool_release(c, &mine.handle, 1);
    kvpool_close(c);
    return std::to_string(both) + " " + std::to_string(after);
  });
  EXPECT_EQ(got, "2 2");
  EXPECT_TRUE(Eventually([&] { return pinned() == 1; }));  // the child's went with it
  EXPECT_EQ(kvpool_release(c, &parent.handle, 1), KVPOOL_OK);
  EXPECT_TRUE(Eventually([&] { return pinned() == 0; }));
  kvpool_close(c);
}

TEST(ClientLifecycle, MissingNodeIsAFastClearError) {
  auto start = std::chrono::steady_clock::now();
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = "/tmp/kvpool-no-such-node.sock";
  kvpool_status st = KVPOOL_OK;
  kvpool_client* c = kvpool_open(&o, &st);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(st, KVPOOL_UNAVAILABLE);
  EXPECT_NE(std::string(kvpool_last_error()).find("no kvpool node at"), std::string::npos)
      << kvpool_last_error();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // A bad options struct is refused, not read past its end.
  o.struct_size = 3;
  EXPECT_EQ(kvpool_open(&o, &st), nullptr);
  EXPECT_EQ(st, KVPOOL_INVALID_ARGUMENT);
}

TEST(ClientLifecycle, StoppedNodeTimesOutWithinTheDeadline) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 300);
  ASSERT_NE(c, nullptr);
  kill(node->pid(), SIGSTOP);
  // kill() returns before the process is stopped: wait until the kernel says
  // it is, or the node may still answer the request below.
  ASSERT_TRUE(Eventually([&] { return ProcessState(node->pid()) == 'T'; }));
  auto start = std::chrono::steady_clock::now();
  kvpool_key_id id = Client::KeyId("stop", "a");
  uint8_t hit;
  EXPECT_EQ(kvpool_exists(c, &id, 1, &hit, nullptr), KVPOOL_DEADLINE_EXCEEDED);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  kill(node->pid(), SIGCONT);
  EXPECT_EQ(kvpool_exists(c, &id, 1, &hit, nullptr), KVPOOL_OK);
  kvpool_close(c);
}

TEST(ClientLifecycle, ConnectionLimitRefusesAndCounts) {
  // The node's own cap (one uid here; the per-uid cap is tenant_test's).
  auto node = NodeProcess::Start({"--max-connections", "4", "--max-connections-per-uid", "4"});
  ASSERT_NE(node, nullptr);
  kvpool_client* legit = Open(node->socket());  // one connection
  ASSERT_NE(legit, nullptr);
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(RawConnect(node->socket()));
  EXPECT_TRUE(Eventually([&] { return node->Metric("kvpool_rejected_connections_total") == 7; }))
      << node->Metric("kvpool_rejected_connections_total");
  kvpool_key_id id = Client::KeyId("limit", "a");
  uint8_t hit;
  EXPECT_EQ(kvpool_exists(legit, &id, 1, &hit, nullptr), KVPOOL_OK);
  for (int fd : fds) close(fd);
  kvpool_close(legit);
}

TEST(ClientLifecycle, SilentConnectionsAreClosedAfterTheHandshakeTimeout) {
  auto node = NodeProcess::Start({"--handshake-timeout", "200ms"});
  ASSERT_NE(node, nullptr);
  int fd = RawConnect(node->socket());
  ASSERT_GE(fd, 0);
  // The node closes it: a read returns EOF (bounded by the node's deadline).
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t r;
  while ((r = read(fd, buf, sizeof(buf))) > 0) {
  }
  EXPECT_EQ(r, 0);
  close(fd);
  EXPECT_EQ(node->Metric("kvpool_protocol_errors_total{reason=\"handshake_timeout\"}"), 1);
}

TEST(ClientLifecycle, SecondNodeOnALiveSocketIsRefusedAndStaleSocketReplaced) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  std::string log;
  auto second = NodeProcess::Start({}, node->socket(), &log);
  EXPECT_EQ(second, nullptr);
  EXPECT_NE(log.find("another kvpool-node is serving"), std::string::npos) << log;
  // A crash leaves the socket file; the next node replaces it.
  std::string socket = node->socket();
  node->Stop(SIGKILL);
  auto third = NodeProcess::Start({}, socket);
  ASSERT_NE(third, nullptr);
  kvpool_client* c = Open(socket);
  EXPECT_NE(c, nullptr);
  kvpool_close(c);
}

}  // namespace
}  // namespace kvpool::testing
