// UCX transport tests over TCP on 127.0.0.1: the shared contract plus what
// only a real network shows (a killed process, malformed messages, limits).
#include "transport/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "common/executor.h"
#include "testing/wait_for.h"
#include "transport/bootstrap_format.h"
#include "transport/peer_format.h"
#include "transport/peer_seal.h"
#include "transport/transport_contract_test.h"

namespace kvpool::transport::testing {
namespace {

using std::chrono::milliseconds;

UcxTransportOptions TcpOptions() {
  UcxTransportOptions o;
  o.listen_host = "127.0.0.1";
  o.tls = "tcp";
  return o;
}

std::unique_ptr<UcxTransport> OpenOrDie(const UcxTransportOptions& o) {
  auto t = UcxTransport::Open(o);
  KVPOOL_CHECK(t.ok());
  return std::move(t).value();
}

// Answers OK to every message of type 1, counting them in *handled (which
// must outlive the server).
void CountCallsOfType1(UcxTransport* server, std::atomic<int>* handled) {
  server->RegisterHandler(1, [handled](Incoming, Responder r) {
    (*handled)++;
    r.Respond(Status::Ok());
  });
}

// One call of type 1, with no payload and a generous deadline.
Status CallType1(UcxTransport* from, const std::string& to) {
  CallArgs a;
  a.peer = to;
  a.type = 1;
  a.deadline = SteadyClock::now() + milliseconds(20000);
  return from->CallSync(a).status;
}

// Counts the tasks it is given and runs them on a pool.
class CountingExecutor final : public Executor {
 public:
  void Submit(std::function<void()> fn) override {
    tasks++;
    pool_.Submit(std::move(fn));
  }
  std::atomic<int> tasks{0};

 private:
  ThreadPool pool_{2, "test-handlers"};
};

ClusterKey TestKey(uint8_t seed) {
  std::array<uint8_t, kClusterKeyBytes> b{};
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed + 3 * i);
  return MakeClusterKey(b);
}

class UcxCluster final : public TestCluster {
 public:
  // handler_executor: run handlers there (as the node does), else on the
  // progress thread. encrypted: every node holds a cluster key and
  // encrypts its connections.
  explicit UcxCluster(Executor* handler_executor = nullptr, bool encrypted = false)
      : executor_(handler_executor), encrypted_(encrypted) {}
  ~UcxCluster() override { nodes_.clear(); }
  Transport* Add() override {
    UcxTransportOptions o = TcpOptions();
    o.handler_executor = executor_;
    if (encrypted_) {
      o.cluster_keys = {TestKey(1)};
      o.peer_encryption = true;
    }
    nodes_.push_back(OpenOrDie(o));
    return nodes_.back().get();
  }
  void Kill(Transport* node) override {
    auto it = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const auto& n) { return n.get() == node; });
    if (it != nodes_.end()) nodes_.erase(it);
  }
  std::string DeadAddress() override {
    // Bind a transport to learn a free port, then close it: nothing listens there.
    auto t = OpenOrDie(TcpOptions());
    return t->address();
  }

 private:
  Executor* const executor_;  // not owned; may be null
  const bool encrypted_;
  std::vector<std::unique_ptr<UcxTransport>> nodes_;
};

// The executor outlives every cluster the tests make.
CountingExecutor* SharedHandlerExecutor() {
  static auto* e = new CountingExecutor();
  return e;
}

INSTANTIATE_TEST_SUITE_P(Ucx, TransportContractTest,
                         ::testing::Values(ClusterFactory{"UcxTcp",
                                                          [] {
                                                            return std::unique_ptr<TestCluster>(
                                                                new UcxCluster());
                                                          }},
                                           ClusterFactory{"UcxTcpHandlerExecutor",
                                                          [] {
                                                            return std::unique_ptr<TestCluster>(
                                                                new UcxCluster(
                                                                    SharedHandlerExecutor()));
                                                          }},
                                           ClusterFactory{"UcxTcpEncrypted",
                                                          [] {
                                                            return std::unique_ptr<TestCluster>(
                                                                new UcxCluster(
                                                                    SharedHandlerExecutor(),
                                                                    /*encrypted=*/true));
                                                          }}),
                         [](const auto& info) { return info.param.name; });

// Requests that arrive together reach the handler executor together (one
// hand-off per burst, not per request), and each is answered as its own.
TEST(UcxTransportTest, BurstOfRequestsIsHandedToTheExecutorInBatches) {
  CountingExecutor executor;
  UcxTransportOptions so = TcpOptions();
  so.handler_executor = &executor;
  auto server = OpenOrDie(so);
  server->RegisterHandler(1, [](Incoming in, Responder r) {
    r.Respond(Status::Ok(), {in.request.begin(), in.request.end()});
  });
  auto client = OpenOrDie(TcpOptions());
  constexpr int kCalls = 256;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, exact = 0;
  std::vector<std::string> bodies(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    bodies[i] = "request-" + std::to_string(i);
    CallArgs a;
    a.peer = server->address();
    a.type = 1;
    a.request = AsBytes(bodies[i]);
    a.deadline = SteadyClock::now() + std::chrono::seconds(10);
    client->Call(a, [&, i](Reply r) {
      std::lock_guard lock(mu);
      if (r.status.ok() && AsString(r.header) == bodies[i]) ++exact;
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return done == kCalls; }));
  EXPECT_EQ(exact, kCalls);
  EXPECT_GE(executor.tasks.load(), kCalls / static_cast<int>(so.max_handler_batch));
  EXPECT_LT(executor.tasks.load(), kCalls);
}

// An outgoing connection with no call in flight for idle_close is closed,
// on both sides, and the next call connects again. With idle_close 0 it
// stays open (the control).
TEST(UcxTransportTest, AnIdleOutgoingConnectionIsClosedAndTheNextCallConnectsAgain) {
  for (const auto idle : {milliseconds(0), milliseconds(500)}) {
    SCOPED_TRACE(idle.count());
    MetricsRegistry server_metrics, client_metrics;
    UcxTransportOptions so = TcpOptions();
    so.metrics = &server_metrics;
    auto server = OpenOrDie(so);
    server->RegisterHandler(1, [](Incoming in, Responder r) {
      r.Respond(Status::Ok(), {in.request.begin(), in.request.end()});
    });
    UcxTransportOptions co = TcpOptions();
    co.idle_close = idle;
    co.metrics = &client_metrics;
    auto client = OpenOrDie(co);
    auto echo = [&](const std::string& body) {
      CallArgs a;
      a.peer = server->address();
      a.type = 1;
      a.request = AsBytes(body);
      a.deadline = SteadyClock::now() + milliseconds(10000);
      Reply r = client->CallSync(a);
      return r.status.ok() ? std::string(AsString(r.header)) : r.status.ToString();
    };
    auto open = [](MetricsRegistry& m) { return m.ValueOf("kvpool_transport_endpoints"); };
    ASSERT_EQ(echo("first"), "first");
    EXPECT_EQ(open(client_metrics), 1);
    if (idle.count() == 0) {
      std::this_thread::sleep_for(milliseconds(1500));
      EXPECT_EQ(open(client_metrics), 1);
      EXPECT_EQ(open(server_metrics), 1);
      EXPECT_EQ(client_metrics.ValueOf("kvpool_transport_idle_closed_total"), 0);
      continue;
    }
    kvpool::testing::WaitFor([&] { return open(client_metrics) == 0 && open(server_metrics) == 0; },
                             milliseconds(5000));
    EXPECT_EQ(open(client_metrics), 0);
    EXPECT_EQ(open(server_metrics), 0);  // the server saw the close
    EXPECT_EQ(client_metrics.ValueOf("kvpool_transport_idle_closed_total"), 1);
    ASSERT_EQ(echo("second"), "second");
    EXPECT_EQ(open(client_metrics), 1);
    EXPECT_EQ(client_metrics.ValueOf("kvpool_transport_idle_closed_total"), 1);
    EXPECT_EQ(client_metrics.ValueOf("kvpool_transport_calls_total", {{"result", "ok"}}), 2);
  }
}

// Two transports that have called each other once, b first (so each has
// its own connection to the other; UCX pairs them): a closes its outgoing
// connections after a_idle, b never. Each answers type 1, counted.
struct CalledEachOther {
  MetricsRegistry ma, mb;
  std::atomic<int> handled_a{0}, handled_b{0};
  std::unique_ptr<UcxTransport> a, b;
  explicit CalledEachOther(milliseconds a_idle) {
    UcxTransportOptions oa = TcpOptions();
    oa.metrics = &ma;
    oa.idle_close = a_idle;
    UcxTransportOptions ob = TcpOptions();
    ob.metrics = &mb;
    ob.idle_close = milliseconds(0);
    a = OpenOrDie(oa);
    b = OpenOrDie(ob);
    CountCallsOfType1(a.get(), &handled_a);
    CountCallsOfType1(b.get(), &handled_b);
  }
  bool CallBoth() {
    return CallType1(b.get(), a->address()).ok() && CallType1(a.get(), b->address()).ok();
  }
};

// UCX may pair a node's connection to a peer with the peer's connection to
// it, so one node's idle close must not cut the other direction: a
// connection whose reverse direction is in use is not idle. Once both are
// idle and one side closes, the other side's connection closes too, and its
// next call connects again.
TEST(UcxTransportTest, AConnectionUsedTheOtherWayIsNotIdleAndAClosedOneReconnects) {
  CalledEachOther t(milliseconds(300));
  ASSERT_TRUE(t.CallBoth());  // a's own connection to b, then idle
  auto& [ma, mb, handled_a, handled_b, a, b] = t;
  int failed = 0;
  std::string first_failure;
  const auto until = SteadyClock::now() + milliseconds(1500);  // 5 x a's idle time
  while (SteadyClock::now() < until) {
    CallArgs c;
    c.peer = a->address();
    c.type = 1;
    c.deadline = SteadyClock::now() + milliseconds(1000);
    Status s = b->CallSync(c).status;
    if (!s.ok() && failed++ == 0) first_failure = s.ToString();
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(failed, 0) << first_failure;
  // a's connection carried b's calls all along, so a kept it. (This assumes
  // UCX paired the two endpoints, as the UCX of this project's platform
  // does on loopback TCP; unpaired, a's connection would really be idle.)
  EXPECT_EQ(ma.ValueOf("kvpool_transport_idle_closed_total"), 0);
  // Both ways idle: a closes; b's connection goes with it, and b's next call
  // to a connects again.
  kvpool::testing::WaitFor([&] { return ma.ValueOf("kvpool_transport_idle_closed_total") >= 1; },
                           milliseconds(5000));
  EXPECT_GE(ma.ValueOf("kvpool_transport_idle_closed_total"), 1);
  std::this_thread::sleep_for(milliseconds(200));  // the close reaches b
  const int before = handled_a.load();
  EXPECT_TRUE(CallType1(b.get(), a->address()).ok());
  EXPECT_TRUE(CallType1(a.get(), b->address()).ok());
  EXPECT_EQ(handled_a.load(), before + 1);
  EXPECT_EQ(mb.ValueOf("kvpool_transport_calls_total", {{"result", "timeout"}}), 0);
}

// A peer's call still being served keeps the connection it is answered
// over, however long it takes: a handler that answers after 4 x a's idle
// time still answers b.
TEST(UcxTransportTest, AConnectionServingThePeersCallIsNotClosedIdle) {
  CalledEachOther t(milliseconds(200));
  auto& [ma, mb, handled_a, handled_b, a, b] = t;
  a->RegisterHandler(2, [](Incoming, Responder r) {
    std::thread([r = std::move(r)]() mutable {
      std::this_thread::sleep_for(milliseconds(800));
      r.Respond(Status::Ok());
    }).detach();
  });
  ASSERT_TRUE(t.CallBoth());
  CallArgs c;
  c.peer = a->address();
  c.type = 2;
  c.deadline = SteadyClock::now() + milliseconds(5000);
  Status s = b->CallSync(c).status;
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ma.ValueOf("kvpool_transport_idle_closed_total"), 0);  // (UCX paired them, as above)
}

// At max_endpoints, a call to a new peer closes the least recently used
// outgoing connection with no call in flight; when every connection has a
// call in flight, the call is refused.
TEST(UcxTransportTest, AtTheConnectionLimitTheLeastRecentlyUsedIdleConnectionMakesRoom) {
  std::mutex mu;
  std::vector<Responder> held;
  std::vector<std::unique_ptr<UcxTransport>> servers;
  std::vector<MetricsRegistry> server_metrics(3);
  for (int i = 0; i < 3; ++i) {
    UcxTransportOptions so = TcpOptions();
    so.metrics = &server_metrics[i];
    servers.push_back(OpenOrDie(so));
    servers.back()->RegisterHandler(1, [](Incoming, Responder r) { r.Respond(Status::Ok()); });
    // Type 2 is answered only when the test lets it.
    servers.back()->RegisterHandler(2, [&](Incoming, Responder r) {
      std::lock_guard lock(mu);
      held.push_back(std::move(r));
    });
  }
  MetricsRegistry metrics;
  UcxTransportOptions co = TcpOptions();
  co.max_endpoints = 2;
  co.idle_close = milliseconds(0);
  co.metrics = &metrics;
  auto client = OpenOrDie(co);
  ASSERT_TRUE(CallType1(client.get(), servers[0]->address()).ok());
  ASSERT_TRUE(CallType1(client.get(), servers[1]->address()).ok());
  ASSERT_TRUE(CallType1(client.get(), servers[0]->address()).ok());  // 1 is now the older
  ASSERT_TRUE(CallType1(client.get(), servers[2]->address()).ok());
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_idle_closed_total"), 1);
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_endpoints"), 2);
  kvpool::testing::WaitFor(
      [&] { return server_metrics[1].ValueOf("kvpool_transport_endpoints") == 0; },
      milliseconds(5000));
  EXPECT_EQ(server_metrics[1].ValueOf("kvpool_transport_endpoints"), 0);  // closed
  EXPECT_EQ(server_metrics[0].ValueOf("kvpool_transport_endpoints"), 1);  // kept

  // Calls in flight on both connections: none is idle, so a third peer is refused.
  std::atomic<int> answered{0};
  for (int i : {0, 2}) {
    CallArgs a;
    a.peer = servers[i]->address();
    a.type = 2;
    a.deadline = SteadyClock::now() + milliseconds(20000);
    client->Call(a, [&](Reply r) {
      if (r.status.ok()) answered++;
    });
  }
  kvpool::testing::WaitFor(
      [&] {
        std::lock_guard lock(mu);
        return held.size() == 2;
      },
      milliseconds(5000));
  Status refused = CallType1(client.get(), servers[1]->address());
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_NE(refused.message().find("too many peer connections"), std::string::npos);
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_idle_closed_total"), 1);
  {
    std::lock_guard lock(mu);
    for (Responder& r : held) r.Respond(Status::Ok());
  }
  kvpool::testing::WaitFor([&] { return answered.load() == 2; }, milliseconds(5000));
  EXPECT_EQ(answered.load(), 2);
  ASSERT_TRUE(CallType1(client.get(), servers[1]->address()).ok());  // room again
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_idle_closed_total"), 2);
}

// A server for the tests of silent connections: type 1 answers at once and
// records the connection it came on (Incoming::peer, the caller's bootstrap
// address: a new connection has a new one); type 2 is never answered while
// the test runs; type 3 answers after 400 ms.
struct SilentPeer {
  MetricsRegistry server_metrics, client_metrics;
  std::unique_ptr<UcxTransport> server, client;
  std::mutex mu;
  std::vector<std::string> type1_peers;
  std::vector<Responder> held;
  SilentPeer() {
    UcxTransportOptions so = TcpOptions();
    so.metrics = &server_metrics;
    server = OpenOrDie(so);
    server->RegisterHandler(1, [this](Incoming in, Responder r) {
      {
        std::lock_guard lock(mu);
        type1_peers.push_back(in.peer);
      }
      r.Respond(Status::Ok());
    });
    server->RegisterHandler(2, [this](Incoming, Responder r) {
      std::lock_guard lock(mu);
      held.push_back(std::move(r));
    });
    server->RegisterHandler(3, [](Incoming, Responder r) {
      std::thread([r = std::move(r)]() mutable {
        std::this_thread::sleep_for(milliseconds(400));
        r.Respond(Status::Ok());
      }).detach();
    });
    UcxTransportOptions co = TcpOptions();
    co.metrics = &client_metrics;
    co.idle_close = milliseconds(0);
    client = OpenOrDie(co);
  }
  ~SilentPeer() {
    std::lock_guard lock(mu);
    for (Responder& r : held) r.Respond(Status::Ok());
  }
  // Starts a call of `type` with `deadline_ms`; its status lands in *out.
  void Start(MessageType type, int deadline_ms, std::atomic<int>* done, Status* out) {
    CallArgs a;
    a.peer = server->address();
    a.type = type;
    a.deadline = SteadyClock::now() + milliseconds(deadline_ms);
    client->Call(a, [done, out](Reply r) {
      *out = r.status;
      (*done)++;
    });
  }
  // The connection each type-1 call came on, in order.
  std::vector<std::string> Type1Peers() {
    std::lock_guard lock(mu);
    return type1_peers;
  }
  int64_t SilentClosed() { return client_metrics.ValueOf("kvpool_transport_silent_closed_total"); }
};

// A link that drops packets leaves TCP retransmitting on a backed-off timer
// long after it heals, so a connection on which a call got nothing back
// within its deadline is replaced: the next call connects afresh, and the
// old connection closes once its calls are settled.
TEST(UcxTransportTest, ACallUnansweredOnASilentConnectionMovesTheNextCallToANewOne) {
  SilentPeer t;
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());
  CallArgs a;
  a.peer = t.server->address();
  a.type = 2;
  a.deadline = SteadyClock::now() + milliseconds(300);
  EXPECT_EQ(t.client->CallSync(a).status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(t.SilentClosed(), 1);
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());
  auto peers = t.Type1Peers();
  ASSERT_EQ(peers.size(), 3u);
  EXPECT_NE(peers[1], peers[0]);  // a new connection
  EXPECT_EQ(peers[2], peers[1]);  // kept: it answers
  EXPECT_EQ(t.SilentClosed(), 1);
  // The old connection is gone on both sides.
  kvpool::testing::WaitFor(
      [&] { return t.server_metrics.ValueOf("kvpool_transport_endpoints") == 1; },
      milliseconds(5000));
  EXPECT_EQ(t.server_metrics.ValueOf("kvpool_transport_endpoints"), 1);
  EXPECT_EQ(t.client_metrics.ValueOf("kvpool_transport_endpoints"), 1);
}

// A slow but healthy peer keeps its connection. A reply that arrives after
// the late call was sent shows the link works; and a connection set aside
// when a call timed out with nothing received takes calls again once a
// reply arrives on it (no other connection to the peer was made meanwhile).
TEST(UcxTransportTest, AConnectionThatAnswersIsKeptWhenOneCallTimesOut) {
  SilentPeer t;
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());
  std::atomic<int> done{0};
  Status unanswered, slow;
  // The late call first, then one answered at once: a reply after it was sent.
  t.Start(2, 300, &done, &unanswered);
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());
  kvpool::testing::WaitFor([&] { return done.load() == 1; }, milliseconds(5000));
  EXPECT_EQ(unanswered.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(t.SilentClosed(), 0);
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());

  // Both at once: the late call times out at 150 ms with nothing received
  // (set aside), the slow one is answered at 400 ms (taken back).
  t.Start(3, 5000, &done, &slow);
  t.Start(2, 150, &done, &unanswered);
  kvpool::testing::WaitFor([&] { return done.load() == 3; }, milliseconds(5000));
  EXPECT_TRUE(slow.ok()) << slow.ToString();
  EXPECT_EQ(unanswered.code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(CallType1(t.client.get(), t.server->address()).ok());
  auto peers = t.Type1Peers();
  ASSERT_EQ(peers.size(), 4u);
  for (const auto& p : peers) EXPECT_EQ(p, peers[0]);  // one connection throughout
  EXPECT_EQ(t.SilentClosed(), 0);
  EXPECT_EQ(t.client_metrics.ValueOf("kvpool_transport_endpoints"), 1);
}

// Which UCX settings leave UCX's own TCP data port unpinned (the node warns
// at start then).
TEST(UcxTcpPortUnpinnedTest, TcpIsPossibleUnlessUcxTlsLeavesItOut) {
  EXPECT_TRUE(UcxTcpPortUnpinned(nullptr, nullptr));  // UCX picks, tcp among them
  EXPECT_TRUE(UcxTcpPortUnpinned("", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("tcp", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("rc,sm,tcp", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("all", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("^rc", nullptr));  // all but rc
  EXPECT_FALSE(UcxTcpPortUnpinned("rc,sm,self", nullptr));
  EXPECT_FALSE(UcxTcpPortUnpinned("^tcp", nullptr));
  EXPECT_FALSE(UcxTcpPortUnpinned("^rc,tcp", nullptr));
}

TEST(UcxTcpPortUnpinnedTest, APortRangePinsIt) {
  EXPECT_FALSE(UcxTcpPortUnpinned("tcp", "7401-7401"));
  EXPECT_FALSE(UcxTcpPortUnpinned(nullptr, "7401-7410"));
  EXPECT_TRUE(UcxTcpPortUnpinned("tcp", "0"));  // UCX's default: the system picks
  EXPECT_TRUE(UcxTcpPortUnpinned("tcp", ""));
}

TEST(UcxTransportTest, ReportsBoundPort) {
  auto t = OpenOrDie(TcpOptions());
  EXPECT_NE(t->port(), 0);
  EXPECT_EQ(t->address(), "127.0.0.1:" + std::to_string(t->port()));
}

// Forks a process that serves on a UCX transport (set up by `serve`, which
// runs in the child) until it is killed; returns its pid and peer port, or
// pid -1. Call before this process opens UCX itself.
std::pair<pid_t, uint16_t> ForkServer(const std::function<void(UcxTransport*)>& serve) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, 0};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto t = UcxTransport::Open(TcpOptions());
    if (!t.ok()) _exit(1);
    serve(t->get());
    uint16_t port = (*t)->port();
    if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    while (true) pause();
  }
  close(fds[1]);
  uint16_t port = 0;
  bool got = pid > 0 && read(fds[0], &port, sizeof(port)) == static_cast<ssize_t>(sizeof(port));
  close(fds[0]);
  return {got ? pid : -1, port};
}

TEST(UcxTransportTest, KilledServerProcessIsUnavailableQuickly) {
  // A server whose handler never answers, until it is killed; it tells this
  // process through a pipe that the request arrived.
  std::vector<Responder> held;
  std::mutex mu;
  int arrived[2];
  ASSERT_EQ(pipe(arrived), 0);
  auto [pid, port] = ForkServer([&](UcxTransport* t) {
    t->RegisterHandler(1, [&](Incoming, Responder r) {
      std::lock_guard<std::mutex> lock(mu);
      held.push_back(std::move(r));
      const char one = 1;
      if (write(arrived[1], &one, 1) != 1) _exit(1);
    });
  });
  close(arrived[1]);
  ASSERT_GT(pid, 0);

  auto client = OpenOrDie(TcpOptions());
  std::atomic<bool> done{false};
  Status st;
  SteadyClock::time_point finished;
  CallArgs a;
  a.peer = "127.0.0.1:" + std::to_string(port);
  a.type = 1;
  a.deadline = SteadyClock::now() + milliseconds(20000);
  client->Call(a, [&](Reply r) {
    st = std::move(r.status);
    finished = SteadyClock::now();
    done = true;
  });
  pollfd pfd{arrived[0], POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 10000), 1) << "the request did not reach the child";
  close(arrived[0]);
  auto killed = SteadyClock::now();
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ASSERT_TRUE(
      kvpool::testing::WaitFor([&] { return done.load(); }, milliseconds(30000), milliseconds(1)));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_LT(finished - killed, milliseconds(3000));

  // The next call to the dead address fails fast too (a new endpoint, refused).
  a.deadline = SteadyClock::now() + milliseconds(20000);
  auto start = SteadyClock::now();
  Reply r = client->CallSync(a);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_LT(SteadyClock::now() - start, milliseconds(3000));
}

// A peer process that dies while the listener is still connecting back to
// it (UCX makes a reply endpoint for its first request) should cost the
// listener that endpoint, never the process. Each peer calls and then kills
// itself within 0-3 ms. With Debian 12's UCX 1.13.1 the listener aborts on
// an assertion in its TCP transport (the wireup reply still queued on the
// failed endpoint) within the first few peers, and no UCX setting avoids it
// (docs/reliability.md, "Not promised today"). Disabled until the UCX in use
// has the fix; run it with --gtest_also_run_disabled_tests.
TEST(UcxTransportTest, DISABLED_PeersKilledWhileConnectingDoNotTakeTheListenerDown) {
  std::atomic<int> handled{0};
  auto [server, port] = ForkServer([&](UcxTransport* t) { CountCallsOfType1(t, &handled); });
  ASSERT_GT(server, 0);
  std::string peer = "127.0.0.1:" + std::to_string(port);

  constexpr int kPeers = 60;
  int server_status = 0;
  bool server_died = false;
  for (int i = 0; i < kPeers && !server_died; ++i) {
    pid_t p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      auto t = UcxTransport::Open(TcpOptions());
      if (!t.ok()) _exit(1);
      CallArgs a;
      a.peer = peer;
      a.type = 1;
      a.deadline = SteadyClock::now() + milliseconds(2000);
      (*t)->Call(a, [](Reply) {});
      // Sleeps: real processes: calls spread over the kill.
      std::this_thread::sleep_for(std::chrono::microseconds((i * 577) % 3000));
      kill(getpid(), SIGKILL);
    }
    int st = 0;
    waitpid(p, &st, 0);
    server_died = waitpid(server, &server_status, WNOHANG) == server;
  }
  std::this_thread::sleep_for(milliseconds(300));  // the last reply endpoints fail
  if (!server_died) server_died = waitpid(server, &server_status, WNOHANG) == server;
  ASSERT_FALSE(server_died) << "listener exited, status " << server_status;

  // It still serves.
  auto client = OpenOrDie(TcpOptions());
  CallArgs a;
  a.peer = peer;
  a.type = 1;
  a.deadline = SteadyClock::now() + milliseconds(5000);
  Reply r = client->CallSync(a);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
}

// A listener (with keys `server_keys`) and one call to it from a connector
// with keys `client_keys`: the call's status, the handler calls and the
// listener's metrics.
struct AuthOutcome {
  Status status;
  int handled = 0;
  MetricsRegistry metrics;
};
void CallWithKeys(const std::vector<ClusterKey>& server_keys,
                  const std::vector<ClusterKey>& client_keys, AuthOutcome* out) {
  UcxTransportOptions so = TcpOptions();
  so.cluster_keys = server_keys;
  so.identity = "b/7";
  so.metrics = &out->metrics;
  auto server = OpenOrDie(so);
  std::atomic<int> handled{0};
  CountCallsOfType1(server.get(), &handled);
  UcxTransportOptions co = TcpOptions();
  co.cluster_keys = client_keys;
  co.identity = "a/3";
  auto client = OpenOrDie(co);
  CallArgs a;
  a.peer = server->address();
  a.type = 1;
  a.deadline = SteadyClock::now() + milliseconds(5000);
  out->status = client->CallSync(a).status;
  out->handled = handled.load();
}

TEST(UcxTransportTest, PeersHoldingTheClusterKeyAuthenticateAndCall) {
  AuthOutcome o;
  CallWithKeys({TestKey(1)}, {TestKey(1)}, &o);
  EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(o.handled, 1);
  EXPECT_EQ(o.metrics.ValueOf("kvpool_transport_authenticated_total", {{"side", "listener"}}), 1);
  // While a key is rotated in, a listener holding both accepts either.
  AuthOutcome rotating;
  CallWithKeys({TestKey(2), TestKey(1)}, {TestKey(1)}, &rotating);
  EXPECT_TRUE(rotating.status.ok()) << rotating.status.ToString();
}

TEST(UcxTransportTest, WithoutTheRightKeyACallIsPermissionDeniedAndNoHandlerRuns) {
  struct Case {
    std::vector<ClusterKey> server, client;
    const char* reason;
  };
  const Case cases[] = {
      {{TestKey(1)}, {TestKey(2)}, "unknown_key"},
      {{TestKey(1)}, {}, "auth_required"},
      {{}, {TestKey(1)}, "auth_not_configured"},
  };
  for (const Case& c : cases) {
    AuthOutcome o;
    CallWithKeys(c.server, c.client, &o);
    EXPECT_EQ(o.status.code(), StatusCode::kPermissionDenied) << c.reason << ": "
                                                              << o.status.ToString();
    EXPECT_EQ(o.handled, 0) << c.reason;
    EXPECT_EQ(o.metrics.ValueOf("kvpool_transport_bootstrap_refused_total",
                                {{"reason", c.reason}}),
              1)
        << c.reason;
    EXPECT_EQ(o.metrics.ValueOf("kvpool_transport_authenticated_total", {{"side", "listener"}}),
              0);
  }
}

// A client token authenticates a connection as that client's: it may send
// the message types the listener allows clients, with its name on each
// request, and is refused the others before any handler runs.
TEST(UcxTransportTest, AClientTokenAllowsOnlyTheClientsMessageTypes) {
  MetricsRegistry metrics;
  UcxTransportOptions so = TcpOptions();
  so.cluster_keys = {TestKey(1)};
  ClusterKey token = TestKey(5);
  token.principal = "engine-7";
  so.client_tokens = {token};
  so.client_message_types = {1};
  so.metrics = &metrics;
  auto server = OpenOrDie(so);
  std::mutex mu;
  std::vector<std::string> principals;
  for (MessageType t : {MessageType{1}, MessageType{2}}) {
    server->RegisterHandler(t, [&](Incoming in, Responder r) {
      std::lock_guard<std::mutex> lock(mu);
      principals.push_back(std::to_string(in.type) + ":" + in.principal);
      r.Respond(Status::Ok());
    });
  }
  auto call = [&](UcxTransport* from, MessageType type) {
    CallArgs a;
    a.peer = server->address();
    a.type = type;
    a.deadline = SteadyClock::now() + milliseconds(5000);
    return from->CallSync(a).status;
  };
  UcxTransportOptions co = TcpOptions();
  co.cluster_keys = {token};
  co.identity = "client:engine-7";
  auto client = OpenOrDie(co);
  EXPECT_TRUE(call(client.get(), 1).ok());
  Status refused = call(client.get(), 2);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.ToString();
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "client_message_refused"}}),
            1);
  // A member (the cluster key) may send both, with no client name.
  UcxTransportOptions mo = TcpOptions();
  mo.cluster_keys = {TestKey(1)};
  auto member = OpenOrDie(mo);
  EXPECT_TRUE(call(member.get(), 2).ok());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(principals, (std::vector<std::string>{"1:engine-7", "2:"}));
}

// A raw TCP connection to a listener on 127.0.0.1 (-1 when it fails).
int ConnectTcp(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends until it closes; closes fd.
std::vector<uint8_t> ReadUntilClosed(int fd) {
  std::vector<uint8_t> in;
  uint8_t buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) in.insert(in.end(), buf, buf + n);
  close(fd);
  return in;
}

// A connection that stops inside the handshake (a hello, then silence) is
// closed at the bootstrap deadline and never gets the worker address.
TEST(UcxTransportTest, AConnectionStalledInTheHandshakeIsClosedAtTheDeadline) {
  MetricsRegistry metrics;
  UcxTransportOptions so = TcpOptions();
  so.cluster_keys = {TestKey(1)};
  so.bootstrap_timeout = milliseconds(300);
  so.metrics = &metrics;
  auto server = OpenOrDie(so);
  const int fd = ConnectTcp(server->port());
  ASSERT_GE(fd, 0);
  AuthConnector c(TestKey(1), "a/1");
  BootstrapMessage hello;
  hello.body = *c.Hello();
  std::vector<uint8_t> out = EncodeBootstrap(hello);
  ASSERT_EQ(send(fd, out.data(), out.size(), MSG_NOSIGNAL), static_cast<ssize_t>(out.size()));
  // The challenge comes, then nothing until the close.
  std::vector<uint8_t> in;
  auto start = SteadyClock::now();
  uint8_t buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) in.insert(in.end(), buf, buf + n);
  auto closed_after = SteadyClock::now() - start;
  close(fd);
  BootstrapMessage m;
  size_t used = 0;
  const char* reason = "";
  ASSERT_EQ(ParseBootstrap(in, &m, &used, &reason), BootstrapParse::kDone);
  EXPECT_EQ(m.kind, BootstrapKind::kChallenge);
  EXPECT_EQ(used, in.size());  // no welcome after it
  EXPECT_GE(closed_after, milliseconds(200));
  EXPECT_LT(closed_after, milliseconds(3000));
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_bootstrap_refused_total",
                            {{"reason", "bootstrap_timeout"}}),
            1);
}

// A node of another kvpool version (another bootstrap version) is refused
// with a message that says so, and counted.
TEST(UcxTransportTest, APeerOfAnotherProtocolVersionIsRefusedSayingSo) {
  MetricsRegistry metrics;
  UcxTransportOptions so = TcpOptions();
  so.metrics = &metrics;
  auto server = OpenOrDie(so);
  const int fd = ConnectTcp(server->port());
  ASSERT_GE(fd, 0);
  BootstrapMessage hello;
  std::vector<uint8_t> out = EncodeBootstrap(hello);
  out[4] = kBootstrapVersion + 1;  // the version byte
  ASSERT_EQ(send(fd, out.data(), out.size(), MSG_NOSIGNAL), static_cast<ssize_t>(out.size()));
  const std::vector<uint8_t> in = ReadUntilClosed(fd);
  BootstrapMessage m;
  size_t used = 0;
  const char* reason = "";
  ASSERT_EQ(ParseBootstrap(in, &m, &used, &reason), BootstrapParse::kDone);
  EXPECT_EQ(m.kind, BootstrapKind::kRefuse);
  const std::string why(m.body.begin(), m.body.end());
  EXPECT_NE(why.find("speaks another version of kvpool's peer protocol (this node: bootstrap "
                     "version " +
                     std::to_string(kBootstrapVersion) + ")"),
            std::string::npos)
      << why;
  EXPECT_EQ(
      metrics.ValueOf("kvpool_transport_bootstrap_refused_total", {{"reason", "bad_version"}}), 1);
}

TEST(UcxTransportTest, OversizedPayloadIsRejectedAndCounted) {
  MetricsRegistry metrics;
  UcxTransportOptions so = TcpOptions();
  so.limits.max_payload_bytes = 1 << 20;
  so.metrics = &metrics;
  auto server = OpenOrDie(so);
  std::atomic<int> handled{0};
  CountCallsOfType1(server.get(), &handled);
  auto client = OpenOrDie(TcpOptions());
  std::vector<uint8_t> big(2 << 20, 7);
  CallArgs a;
  a.peer = server->address();
  a.type = 1;
  a.payload = big;
  a.deadline = SteadyClock::now() + milliseconds(20000);
  Reply r = client->CallSync(a);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_EQ(handled.load(), 0);
  EXPECT_EQ(metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "payload_too_large"}}),
            1);
  // A well-formed call afterwards works on a fresh endpoint.
  a.payload = {};
  a.deadline = SteadyClock::now() + milliseconds(20000);
  r = client->CallSync(a);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(handled.load(), 1);
}

// A misbehaving peer: it does the bootstrap (hello, welcome) by hand and
// then sends raw active messages carrying its connection token. With a key
// it authenticates and asks for encryption, and can seal what it sends.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port, const ClusterKey* key = nullptr) {
    ucp_config_t* config;
    KVPOOL_CHECK(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
    KVPOOL_CHECK(ucp_config_modify(config, "TLS", "tcp") == UCS_OK);
    KVPOOL_CHECK(ucp_config_modify(config, "NET_DEVICES", "lo") == UCS_OK);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    KVPOOL_CHECK(ucp_init(&params, config, &context_) == UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    KVPOOL_CHECK(ucp_worker_create(context_, &wp, &worker_) == UCS_OK);
    // Replies are dropped (UCX has no default for an AM id without a handler).
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
    hp.id = kAmReply;
    hp.cb = [](void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
      return UCS_OK;
    };
    KVPOOL_CHECK(ucp_worker_set_am_recv_handler(worker_, &hp) == UCS_OK);

    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    KVPOOL_CHECK(connect(fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0);
    std::unique_ptr<AuthConnector> auth;
    BootstrapMessage hello;
    if (key != nullptr) {
      auth = std::make_unique<AuthConnector>(*key, "raw/1", /*encrypt=*/true);
      hello.body = *auth->Hello();
    }
    SendBootstrap(hello);
    BootstrapMessage welcome = ReadBootstrap();
    if (auth != nullptr) {
      KVPOOL_CHECK(welcome.kind == BootstrapKind::kChallenge);
      std::string listener;
      BootstrapMessage proof;
      proof.kind = BootstrapKind::kProof;
      proof.body = *auth->Answer(welcome.body, &listener);
      SendBootstrap(proof);
      welcome = ReadBootstrap();
      KVPOOL_CHECK(auth->encrypted());
      seal_ = std::move(PeerSeal::Make(auth->session_keys().connector_to_listener,
                                       auth->session_keys().listener_to_connector))
                  .value();
    }
    KVPOOL_CHECK(welcome.kind == BootstrapKind::kWelcome);
    token_ = welcome.token;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(welcome.body.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    KVPOOL_CHECK(ucp_ep_create(worker_, &ep, &ep_) == UCS_OK);
  }
  ~RawPeer() {
    close(fd_);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep_, &p);
    if (UCS_PTR_IS_PTR(req)) {
      auto until = SteadyClock::now() + milliseconds(1000);
      while (ucp_request_check_status(req) == UCS_INPROGRESS && SteadyClock::now() < until) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(req);
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  // A request sealed as the transport seals it (with the token set).
  void Seal(std::vector<uint8_t>* header, std::vector<uint8_t>* data) {
    SetFrameConn(header, token_);
    KVPOOL_CHECK(seal_->Seal(header, *data, data->data()).ok());
  }
  // Sends (with this connection's token in a header long enough to hold a
  // frame, unless sealed: that would break the seal) and progresses until
  // the send completes.
  void Send(std::vector<uint8_t> header, const std::vector<uint8_t>& data, bool sealed = false) {
    if (header.size() >= kFrameBytes && !sealed) SetFrameConn(&header, token_);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    void* req = ucp_am_send_nbx(ep_, kAmRequest, header.data(), header.size(), data.data(),
                                data.size(), &p);
    if (UCS_PTR_IS_PTR(req)) {
      auto until = SteadyClock::now() + milliseconds(5000);
      while (ucp_request_check_status(req) == UCS_INPROGRESS && SteadyClock::now() < until) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(req);
    }
  }
  // Progresses until the server closes the connection, which it does by
  // closing the bootstrap socket (or the time is up).
  bool WaitForFailure(milliseconds budget) {
    auto until = SteadyClock::now() + budget;
    while (SteadyClock::now() < until) {
      ucp_worker_progress(worker_);
      pollfd pf{fd_, POLLIN, 0};
      if (poll(&pf, 1, 5) == 1) {
        uint8_t b;
        if (recv(fd_, &b, 1, MSG_DONTWAIT) <= 0) return true;
      }
    }
    return false;
  }

 private:
  void SendBootstrap(const BootstrapMessage& m) {
    std::vector<uint8_t> out = EncodeBootstrap(m);
    KVPOOL_CHECK(send(fd_, out.data(), out.size(), MSG_NOSIGNAL) ==
                 static_cast<ssize_t>(out.size()));
  }
  BootstrapMessage ReadBootstrap() {
    std::vector<uint8_t> in;
    BootstrapMessage m;
    size_t used = 0;
    const char* reason = "";
    while (ParseBootstrap(in, &m, &used, &reason) == BootstrapParse::kNeedMore) {
      uint8_t buf[1];  // byte by byte: nothing of the next message is taken
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      KVPOOL_CHECK(n > 0);
      in.insert(in.end(), buf, buf + n);
    }
    return m;
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  int fd_ = -1;
  uint32_t token_ = 0;
  std::unique_ptr<PeerSeal> seal_;
};

TEST(UcxTransportTest, MalformedMessagesAreRejectedCountedAndCloseTheEndpoint) {
  MetricsRegistry metrics;
  UcxTransportOptions so = TcpOptions();
  so.metrics = &metrics;
  auto server = OpenOrDie(so);
  std::atomic<int> handled{0};
  CountCallsOfType1(server.get(), &handled);
  struct Case {
    const char* reason;
    std::vector<uint8_t> header;
    std::vector<uint8_t> data;
  };
  Frame good;
  good.type = 1;
  good.request_id = 1;
  std::vector<uint8_t> bad_magic = EncodeFrame(good, {});
  bad_magic[0] ^= 0xFF;
  Frame lying = good;
  lying.payload_len = 1000;  // claims more than the data carries
  Frame huge = good;
  huge.payload_len = uint64_t{1} << 40;
  std::vector<uint8_t> bad_header_len = EncodeFrame(good, {});
  bad_header_len[20] = 200;  // more header bytes than present
  std::vector<Case> cases = {
      {"short_frame", {1, 2, 3}, {}},
      {"bad_magic", bad_magic, {}},
      {"payload_length_mismatch", EncodeFrame(lying, {}), {1, 2, 3}},
      {"payload_too_large", EncodeFrame(huge, {}), {}},
      {"header_length_mismatch", bad_header_len, {}},
  };
  for (const Case& c : cases) {
    RawPeer peer(server->port());
    peer.Send(c.header, c.data);
    // A header too short to hold a frame names no connection: it is counted
    // and dropped, and the connection stays.
    bool names_connection = c.header.size() >= kFrameBytes;
    EXPECT_EQ(peer.WaitForFailure(milliseconds(names_connection ? 5000 : 300)), names_connection)
        << c.reason;
    EXPECT_EQ(metrics.ValueOf("kvpool_transport_errors_total", {{"reason", c.reason}}), 1)
        << c.reason;
  }
  EXPECT_EQ(handled.load(), 0);
  // The server still serves well-behaved peers.
  auto client = OpenOrDie(TcpOptions());
  EXPECT_TRUE(CallType1(client.get(), server->address()).ok());
}

// On an encrypted connection, a request that was tampered with (header,
// payload, eager or rendezvous), forged in the clear, or replayed is
// refused before any handler sees it, counted, and closes the connection;
// the same request sealed correctly is handled once.
TEST(UcxTransportTest, EncryptedRequestsThatFailTheirCheckAreRefusedAndCloseTheEndpoint) {
  MetricsRegistry metrics;
  UcxTransportOptions so = TcpOptions();
  so.cluster_keys = {TestKey(1)};  // the raw peer asks for encryption: the listener follows
  so.metrics = &metrics;
  auto server = OpenOrDie(so);
  std::mutex mu;
  std::vector<std::vector<uint8_t>> seen;  // payloads handled
  server->RegisterHandler(1, [&](Incoming in, Responder r) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(in.payload.begin(), in.payload.end());
    r.Respond(Status::Ok());
  });
  auto handled = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return seen.size();
  };
  Frame f;
  f.type = 1;
  f.request_id = 1;
  f.budget_ms = 5000;
  const ClusterKey key = TestKey(1);
  const std::vector<uint8_t> message = {1, 2, 3, 4};
  for (size_t bytes : {size_t{100}, size_t{1} << 20}) {  // eager and rendezvous
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> payload(bytes);
    for (size_t i = 0; i < bytes; ++i) payload[i] = static_cast<uint8_t>(i * 11);
    f.payload_len = bytes;
    const size_t handled_before = handled();
    for (const char* how : {"header", "payload", "tag"}) {
      RawPeer peer(server->port(), &key);
      std::vector<uint8_t> header = EncodeFrame(f, message), data = payload;
      peer.Seal(&header, &data);
      if (std::string(how) == "header") header[kFrameBytes + 1] ^= 1;
      if (std::string(how) == "payload") data[bytes / 2] ^= 1;
      if (std::string(how) == "tag") header.back() ^= 1;
      double before = metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "bad_seal"}});
      peer.Send(header, data, /*sealed=*/true);
      EXPECT_TRUE(peer.WaitForFailure(milliseconds(5000))) << how;
      EXPECT_EQ(metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "bad_seal"}}),
                std::max(before, 0.0) + 1)
          << how;
    }
    EXPECT_EQ(handled(), handled_before);
    // Sealed correctly it is handled, exactly once: the same bytes again are
    // a replay.
    RawPeer peer(server->port(), &key);
    std::vector<uint8_t> header = EncodeFrame(f, message), data = payload;
    peer.Seal(&header, &data);
    size_t before = handled();
    peer.Send(header, data, /*sealed=*/true);
    kvpool::testing::WaitFor([&] { return handled() != before; }, milliseconds(5000));
    ASSERT_EQ(handled(), before + 1);
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(seen.back(), payload);
    }
    double replays = metrics.ValueOf("kvpool_transport_errors_total",
                                     {{"reason", "replayed_message"}});
    peer.Send(header, data, /*sealed=*/true);
    EXPECT_TRUE(peer.WaitForFailure(milliseconds(5000)));
    EXPECT_EQ(metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "replayed_message"}}),
              std::max(replays, 0.0) + 1);
    EXPECT_EQ(handled(), before + 1);
    // A frame in the clear on an encrypted connection carries no seal.
    RawPeer clear(server->port(), &key);
    double bad = metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "bad_seal"}});
    clear.Send(EncodeFrame(f, {}), payload);
    EXPECT_TRUE(clear.WaitForFailure(milliseconds(5000)));
    EXPECT_EQ(metrics.ValueOf("kvpool_transport_errors_total", {{"reason", "bad_seal"}}), bad + 1);
    f.request_id++;
  }
  EXPECT_EQ(handled(), 2u);
  // Well-behaved peers, encrypted or not, are still served.
  UcxTransportOptions co = TcpOptions();
  co.cluster_keys = {TestKey(1)};
  co.peer_encryption = true;
  auto client = OpenOrDie(co);
  EXPECT_TRUE(CallType1(client.get(), server->address()).ok());
}

// A connector that asks for encryption refuses a listener that would not
// encrypt; a listener that encrypts encrypts for a connector that did not
// ask; encryption without a key is refused at open.
TEST(UcxTransportTest, EncryptionIsNegotiatedAndCannotBeStripped) {
  UcxTransportOptions bad = TcpOptions();
  bad.peer_encryption = true;
  EXPECT_EQ(UcxTransport::Open(bad).status().code(), StatusCode::kInvalidArgument);
  for (int server_encrypts = 0; server_encrypts < 2; ++server_encrypts) {
    MetricsRegistry metrics;
    UcxTransportOptions so = TcpOptions();
    so.cluster_keys = {TestKey(1)};
    so.peer_encryption = server_encrypts != 0;
    so.metrics = &metrics;
    auto server = OpenOrDie(so);
    server->RegisterHandler(1, [](Incoming in, Responder r) {
      auto echo = std::make_shared<std::vector<uint8_t>>(in.payload.begin(), in.payload.end());
      r.Respond(ServerReply{Status::Ok(), {9, 8, 7}, *echo, [echo] {}});
    });
    for (int client_encrypts = 0; client_encrypts < 2; ++client_encrypts) {
      UcxTransportOptions co = TcpOptions();
      co.cluster_keys = {TestKey(1)};
      co.peer_encryption = client_encrypts != 0;
      auto client = OpenOrDie(co);
      std::vector<uint8_t> payload(300000);
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i % 251);
      const std::vector<uint8_t> request = {1, 2};
      CallArgs a;
      a.peer = server->address();
      a.type = 1;
      a.request = request;
      a.payload = payload;
      a.deadline = SteadyClock::now() + milliseconds(20000);
      Reply r = client->CallSync(a);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      EXPECT_EQ(r.header, (std::vector<uint8_t>{9, 8, 7}));
      EXPECT_EQ(r.payload, payload);
    }
  }
}

}  // namespace
}  // namespace kvpool::transport::testing
