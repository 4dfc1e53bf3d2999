#include "admin/admin_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/loopback_test_util.h"
#include "gtest/gtest.h"
#include "testing/manual_scheduler.h"
#include "testing/wait_for.h"

namespace kvpool {
namespace {

constexpr char kMetricsType[] = "text/plain; version=0.0.4; charset=utf-8";

// What a node registers, with fixed values so outputs can be asserted exactly.
void PopulateNodeMetrics(MetricsRegistry* r) {
  r->GetCounter("kvpool_ops_total", "Operations served, by op.", {{"op", "get"}})->Inc(1000);
  r->GetCounter("kvpool_ops_total", "Operations served, by op.", {{"op", "put"}})->Inc(500);
  r->GetCounter("kvpool_hits_total", "Gets that found the key.")->Inc(750);
  r->GetCounter("kvpool_misses_total", "Gets that missed.")->Inc(250);
  r->GetCounter("kvpool_bytes_read_total", "Bytes returned by gets.")->Inc(1 << 20);
  r->GetCounter("kvpool_bytes_written_total", "Bytes committed by puts.")->Inc(1 << 21);
  // 100 gets in the (512 us, 1024 us] bucket: p50 interpolates to 768 us.
  Histogram* get_latency =
      r->GetHistogram("kvpool_op_latency_seconds", "Operation latency.", {{"op", "get"}});
  for (int i = 0; i < 100; ++i) get_latency->Observe(0.0008);
  r->GetHistogram("kvpool_op_latency_seconds", "Operation latency.", {{"op", "put"}})
      ->Observe(0.002);
  r->GetGauge("kvpool_dram_capacity_bytes", "DRAM pool size.")->Set(int64_t{8} << 30);
  r->GetGauge("kvpool_dram_used_bytes", "DRAM bytes in use.")->Set(int64_t{2} << 30);
  r->GetGauge("kvpool_dram_entries", "Entries in DRAM.")->Set(12345);
  r->GetGauge("kvpool_dram_pinned", "Entries pinned by readers.")->Set(7);
  r->GetGauge("kvpool_dram_reserved", "Entries reserved by writers.")->Set(3);
  r->GetCounter("kvpool_dram_evictions_total", "Entries evicted from DRAM.")->Inc(42);
  r->GetGauge("kvpool_local_connections", "Connected local clients.")->Set(3);
  // Recent windows; no eviction in the last minute (NaN).
  const std::pair<const char*, double> recent[] = {
      {"kvpool_hit_ratio_recent", 0.9},      {"kvpool_exists_prefix_hit_ratio_recent", 0.6},
      {"kvpool_dram_eviction_age_recent_seconds", std::nan("")}};
  for (const auto& [name, v] : recent) {
    r->AddCallbackGauge(name, "Recent.", {{"window", "1m"}}, [v] { return v; });
  }
  r->AddCallbackGauge("kvpool_hit_ratio_recent", "Recent.", {{"window", "10m"}},
                      [] { return 0.8; });
  r->AddCallbackGauge("kvpool_exists_prefix_hit_ratio_recent", "Recent.", {{"window", "10m"}},
                      [] { return 0.55; });
  r->AddCallbackGauge("kvpool_dram_eviction_age_recent_seconds", "Recent.", {{"window", "10m"}},
                      [] { return 200.0; });
  r->GetCounter("kvpool_protocol_errors_total", "Malformed requests, by reason.",
                {{"reason", "bad_magic"}})
      ->Inc(2);
  // The prefix policy's adaptation: shadows at four shares and one of them
  // bimodal, 70 % bimodal chosen.
  r->AddCallbackGauge("kvpool_dram_eviction_protected_share", "Share.", {}, [] { return 0.7; });
  r->AddCallbackGauge("kvpool_dram_eviction_bimodal", "Bimodal.", {}, [] { return 1.0; });
  r->AddCallbackGauge("kvpool_dram_eviction_share_changes", "Changes.", {}, [] { return 2.0; });
  const std::tuple<const char*, const char*, double> shadows[] = {{"0.7", "bimodal", 0.47},
                                                                  {"0.7", "warm", 0.43},
                                                                  {"0.0", "warm", 0.41},
                                                                  {"0.3", "warm", 0.455},
                                                                  {"0.5", "warm", 0.44}};
  for (const auto& [share, insert, ratio] : shadows) {
    r->AddCallbackGauge("kvpool_dram_eviction_shadow_hit_ratio", "Shadow.",
                        {{"share", share}, {"insert", insert}}, [v = ratio] { return v; });
  }
}

// Two members: this node's figures (as its status says them) and one that
// did not answer.
std::string ClusterJson() {
  return R"({"cluster":"test-cluster","members":[)"
         R"({"node_id":"node-test-1","version":"0.1.0","uptime_s":3720,)"
         R"("dram":{"capacity_bytes":8589934592,"used_bytes":2147483648,"entries":12345,)"
         R"("evictions":42},"ssd":null,"local_connections":3,"ops":1500,"hits":750,)"
         R"("misses":250,"hit_ratio_1m":0.9,"address":"127.0.0.1:7000","self":true},)"
         R"({"node_id":"node-test-2","error":"Unavailable: no answer",)"
         R"("address":"127.0.0.1:7001","self":false}]})";
}

std::string StatusJson() {
  nlohmann::json j = {
      {"node_id", "node-test-1"},
      {"version", "0.1.0"},
      {"uptime_s", 3725.5},
      {"instance_id", "inst-abc"},
      {"socket_path", "/tmp/kvpool-test.sock"},
      {"dram",
       {{"capacity_bytes", int64_t{8} << 30},
        {"used_bytes", int64_t{2} << 30},
        {"entries", 12345},
        {"pinned", 7},
        {"reserved", 3},
        {"evictions", 42},
        {"index_bytes_per_entry", 96},
        {"hints",
         {{"retained_entries", 4},
          {"retained_bytes", 4 << 20},
          {"pinned_entries", 2},
          {"pinned_bytes", 1 << 20},
          {"demoted_entries", 0},
          {"leases_expired", 9},
          {"retains_clipped", 0},
          {"prefetched_entries", 3},
          {"prefetch_hits", 12},
          {"prefetch_unused", 1},
          {"prefetch_mean_lead_s", 2.5}}}}},
      {"members",
       {{{"node_id", "node-test-1"}, {"address", "127.0.0.1:7000"}, {"state", "alive"}},
        {{"node_id", "node-test-2"}, {"address", "127.0.0.1:7001"}, {"state", "suspect"}}}}};
  return j.dump();
}

class AdminServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PopulateNodeMetrics(&registry_);
    AdminHooks hooks;
    hooks.status_json = [] { return StatusJson(); };
    hooks.config_json = [] { return std::string(R"({"admin_port":0})"); };
    hooks.ready = [this] { return ready_.load(); };
    hooks.cluster_missing = [this] {
      std::lock_guard lock(missing_mu_);
      return missing_;
    };
    hooks.cluster_json = [] { return ClusterJson(); };
    AdminOptions options;
    // Charts of 100 samples of 100 ms, taken when a test runs the sampler.
    options.history.interval = std::chrono::milliseconds(100);
    options.history.window = std::chrono::seconds(10);
    options.history.scheduler = &history_scheduler_;
    auto server = AdminServer::Start(options, &registry_, std::move(hooks));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    ASSERT_GT(server_->port(), 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
  }

  double Requests(const std::string& path) {
    return registry_.ValueOf("kvpool_admin_requests_total", {{"path", path}});
  }

  MetricsRegistry registry_;
  std::atomic<bool> ready_{false};
  std::mutex missing_mu_;
  std::string missing_;  // protected by missing_mu_
  testing::ManualScheduler history_scheduler_;  // the charts' sampler
  std::unique_ptr<AdminServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(AdminServerTest, MetricsServesRegistryInPrometheusFormat) {
  auto res = client_->Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), kMetricsType);
  EXPECT_NE(res->body.find("# TYPE kvpool_ops_total counter\n"), std::string::npos);
  EXPECT_NE(res->body.find("\nkvpool_ops_total{op=\"get\"} 1000\n"), std::string::npos);
  EXPECT_NE(res->body.find("\nkvpool_hits_total 750\n"), std::string::npos);
  EXPECT_NE(res->body.find("\nkvpool_dram_capacity_bytes 8589934592\n"), std::string::npos);
  EXPECT_NE(res->body.find("\nkvpool_op_latency_seconds_count{op=\"get\"} 100\n"),
            std::string::npos);
  // The scrape counts itself before rendering.
  EXPECT_NE(res->body.find("\nkvpool_admin_requests_total{path=\"/metrics\"} 1\n"),
            std::string::npos)
      << res->body;
}

TEST_F(AdminServerTest, HealthzIsOk) {
  auto res = client_->Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; charset=utf-8");
}

TEST_F(AdminServerTest, ReadyzFollowsHook) {
  auto res = client_->Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "not ready");
  ready_ = true;
  res = client_->Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ready");
}

// /readyz is local work, /readyz/cluster remote work too: while the node
// joins, the first says so with 200 and the second answers 503.
TEST_F(AdminServerTest, ReadyzClusterWaitsForClusterWork) {
  ready_ = true;
  {
    std::lock_guard lock(missing_mu_);
    missing_ = "joining: node id b is still registered";
  }
  auto res = client_->Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body,
            "ready for local work; not yet for cluster work: joining: node id b is still "
            "registered");
  res = client_->Get("/readyz/cluster");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "not ready for cluster work: joining: node id b is still registered");
  {
    std::lock_guard lock(missing_mu_);
    missing_.clear();
  }
  res = client_->Get("/readyz/cluster");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ready");
  ready_ = false;  // stopping: neither is ready
  EXPECT_EQ(client_->Get("/readyz/cluster")->status, 503);
  EXPECT_EQ(client_->Get("/readyz")->status, 503);
}

TEST_F(AdminServerTest, JsonEndpointsServeHooks) {
  auto res = client_->Get("/api/v1/status");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(res->body, StatusJson());
  EXPECT_EQ(res->get_header_value("Cache-Control"), "no-store");

  res = client_->Get("/api/v1/config");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(res->body, R"({"admin_port":0})");
}

TEST_F(AdminServerTest, RootServesSelfContainedDashboard) {
  auto res = client_->Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(res->body.rfind("<!doctype html>", 0), 0u);
  // No absolute URL anywhere: nothing to fetch from elsewhere.
  EXPECT_EQ(res->body.find("://"), std::string::npos);
  EXPECT_NE(res->get_header_value("Content-Security-Policy").find("connect-src 'self'"),
            std::string::npos);
}

TEST_F(AdminServerTest, UnknownPathIs404JsonAndCountedAsOther) {
  auto res = client_->Get("/wp-admin/setup.php");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(res->body, R"({"error":"not found","path":"/wp-admin/setup.php"})");
  ASSERT_TRUE(client_->Get("/another/unknown"));
  EXPECT_EQ(Requests("other"), 2);
  // The scanned paths did not become label values.
  EXPECT_EQ(Requests("/wp-admin/setup.php"), -1);
}

TEST_F(AdminServerTest, NonGetIs405) {
  auto res = client_->Post("/metrics", "x=1", "application/x-www-form-urlencoded");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->get_header_value("Allow"), "GET, HEAD");
  EXPECT_EQ(res->body, R"({"error":"method not allowed","path":"/metrics"})");
  res = client_->Delete("/api/v1/status");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
}

TEST_F(AdminServerTest, RequestCounterCountsEachRequestOnce) {
  EXPECT_EQ(Requests("/healthz"), 0);
  EXPECT_EQ(Requests("/"), 0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->Get("/healthz"));
  ASSERT_TRUE(client_->Get("/"));
  EXPECT_EQ(Requests("/healthz"), 3);
  EXPECT_EQ(Requests("/"), 1);
  EXPECT_EQ(Requests("/readyz"), 0);
  EXPECT_EQ(Requests("other"), 0);
}

TEST_F(AdminServerTest, StopIsIdempotentAndRefusesNewConnections) {
  server_->Stop();
  server_->Stop();
  auto res = client_->Get("/healthz");
  EXPECT_FALSE(res);
}

TEST(AdminServerStartTest, ThrowingHookIs500AndServerKeepsServing) {
  MetricsRegistry registry;
  AdminHooks hooks;
  hooks.status_json = []() -> std::string { throw std::runtime_error("boom"); };
  auto server = AdminServer::Start(AdminOptions{}, &registry, std::move(hooks));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  httplib::Client client("127.0.0.1", (*server)->port());
  auto res = client.Get("/api/v1/status");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(res->body, R"({"error":"internal error","path":"/api/v1/status"})");
  // Empty hooks have defaults.
  res = client.Get("/api/v1/config");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "{}");
  res = client.Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(AdminServerStartTest, ABearerTokenGuardsEverythingButHealthAndReadiness) {
  MetricsRegistry registry;
  AdminOptions o;
  o.bearer_token = "0123456789abcdef-token";
  AdminHooks hooks;
  hooks.status_json = [] { return StatusJson(); };
  auto server = AdminServer::Start(o, &registry, std::move(hooks));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  httplib::Client c("127.0.0.1", (*server)->port());
  for (const char* path : {"/metrics", "/api/v1/status", "/"}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 401) << path;
    EXPECT_EQ(res->get_header_value("WWW-Authenticate"), "Bearer realm=\"kvpool\"");
    EXPECT_EQ(res->body.find("kvpool_"), std::string::npos) << path << ": " << res->body;
  }
  for (const char* wrong : {"Bearer 0123456789abcdef-tokeN", "Bearer 0123456789abcdef-token0",
                            "Basic 0123456789abcdef-token", "0123456789abcdef-token"}) {
    auto res = c.Get("/api/v1/status", {{"Authorization", wrong}});
    ASSERT_TRUE(res) << wrong;
    EXPECT_EQ(res->status, 401) << wrong;
  }
  EXPECT_EQ(registry.ValueOf("kvpool_admin_unauthorized_total"), 7);
  // Probes need no token.
  EXPECT_EQ(c.Get("/healthz")->status, 200);
  EXPECT_EQ(c.Get("/readyz")->status, 200);
  c.set_bearer_token_auth("0123456789abcdef-token");
  auto res = c.Get("/api/v1/status");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, StatusJson());
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  EXPECT_EQ(registry.ValueOf("kvpool_admin_unauthorized_total"), 7);
}

TEST(AdminServerStartTest, PortInUseIsIOError) {
  MetricsRegistry registry;
  auto first = AdminServer::Start(AdminOptions{}, &registry, {});
  ASSERT_TRUE(first.ok());
  AdminOptions options;
  options.port = (*first)->port();
  auto second = AdminServer::Start(options, &registry, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIOError) << second.status().ToString();
}

TEST(AdminOptionsTest, Validate) {
  EXPECT_TRUE(AdminOptions{}.Validate().ok());
  AdminOptions o;
  o.port = 65535;
  o.threads = 16;
  EXPECT_TRUE(o.Validate().ok());
  o.port = 65536;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.port = -1;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = AdminOptions{};
  o.threads = 0;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.threads = 17;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = AdminOptions{};
  o.bind_address = "";
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  MetricsRegistry registry;
  auto server = AdminServer::Start(o, &registry, {});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
}

// ---- slow, idle and busy clients ------------------------------------------


// Everything the server sends until it closes (or `wait` passes).
std::string ReadAll(int fd, std::chrono::milliseconds wait = std::chrono::milliseconds(5000)) {
  std::string out;
  auto until = std::chrono::steady_clock::now() + wait;
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// Sends a raw request and returns the raw response.
std::string RawRequest(int port, const std::string& bytes) {
  int fd = testing::DialLoopback(port);
  if (fd < 0) return "";
  ssize_t w = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  (void)w;
  std::string r = ReadAll(fd);
  ::close(fd);
  return r;
}

// True when the peer has closed fd (EOF or reset) within `wait`.
bool ClosedByPeer(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char b;
  return ::recv(fd, &b, 1, MSG_DONTWAIT) <= 0;
}

// Polls a metric until it has the value or a second passes; returns the last
// value seen. Connections close asynchronously on the server's thread.
double WaitForMetric(MetricsRegistry& r, const std::string& name, double want) {
  testing::WaitFor([&] { return r.ValueOf(name) == want; }, std::chrono::seconds(1));
  return r.ValueOf(name);
}

// Both ends of each test connection live in this process.
void RaiseFdLimit() {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

double HealthzMs(int port) {
  auto t0 = std::chrono::steady_clock::now();
  std::string r = RawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0 && r.ends_with("\r\n\r\nok") ? ms : 1e9;
}

TEST(AdminServerSlowClientsTest, MalformedAndOversizedHeadsGetExplicitErrors) {
  MetricsRegistry registry;
  auto server = AdminServer::Start(AdminOptions{}, &registry, {});
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  EXPECT_EQ(RawRequest(port, "BLAH\r\n\r\n").substr(0, 24), "HTTP/1.1 400 Bad Request");
  std::string big = "GET / HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n";
  EXPECT_EQ(RawRequest(port, big).substr(0, 12), "HTTP/1.1 431");
  EXPECT_EQ(RawRequest(port, "GET / HTTP/2.0\r\n\r\n").substr(0, 12), "HTTP/1.1 505");
  EXPECT_EQ(registry.ValueOf("kvpool_admin_bad_requests_total"), 3);
  // HEAD: the headers of the GET, no body.
  std::string head = RawRequest(port, "HEAD /healthz HTTP/1.0\r\n\r\n");
  EXPECT_NE(head.find("Content-Length: 2\r\n"), std::string::npos) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
}

// POST /api/v1/lookup: the body is read to its Content-Length, across
// reads, and handed to the hook whole; an unsized, chunked or oversized body
// is refused before it is read; POST elsewhere and GET here are 405.
TEST(AdminServerSlowClientsTest, ALookupsBodyIsReadWholeAndBoundedAndOnlyThere) {
  MetricsRegistry registry;
  AdminHooks hooks;
  hooks.lookup = [](const std::string& body) {
    return std::make_pair(body.size() == 9 ? 200 : 400, "{\"got\":\"" + body + "\"}");
  };
  auto server = AdminServer::Start(AdminOptions{}, &registry, std::move(hooks));
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  // The head and the body in separate writes, the body itself in two.
  int fd = testing::DialLoopback(port);
  ASSERT_GE(fd, 0);
  const std::string head = "POST /api/v1/lookup HTTP/1.1\r\nContent-Length: 9\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a real socket's separate reads
  ASSERT_EQ(::send(fd, "{\"a\":", 5, MSG_NOSIGNAL), 5);
  // Sleeps: a real socket: the body in separate reads.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(::send(fd, "[1]}", 4, MSG_NOSIGNAL), 4);
  std::string r = ReadAll(fd);
  ::close(fd);
  EXPECT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
  EXPECT_TRUE(r.ends_with("{\"got\":\"{\"a\":[1]}\"}")) << r;
  // Bytes past the Content-Length are not part of the body.
  r = RawRequest(port, "POST /api/v1/lookup HTTP/1.1\r\nContent-Length: 9\r\n\r\n123456789xyz");
  EXPECT_TRUE(r.ends_with("{\"got\":\"123456789\"}")) << r;
  EXPECT_EQ(RawRequest(port, "POST /api/v1/lookup HTTP/1.1\r\n\r\n").substr(0, 12), "HTTP/1.1 411");
  EXPECT_EQ(RawRequest(port, "POST /api/v1/lookup HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n")
                .substr(0, 12),
            "HTTP/1.1 413");
  EXPECT_EQ(RawRequest(port,
                       "POST /api/v1/lookup HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
                .substr(0, 12),
            "HTTP/1.1 400");
  EXPECT_EQ(RawRequest(port,
                       "POST /api/v1/lookup HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: "
                       "1\r\n\r\nx")
                .substr(0, 12),
            "HTTP/1.1 400");
  EXPECT_EQ(RawRequest(port, "POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx").substr(0, 12),
            "HTTP/1.1 405");
  r = RawRequest(port, "GET /api/v1/lookup HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 405");
  EXPECT_NE(r.find("Allow: POST"), std::string::npos) << r;
  // And the server serves on.
  EXPECT_EQ(RawRequest(port, "GET /healthz HTTP/1.1\r\n\r\n").substr(0, 15), "HTTP/1.1 200 OK");
}

TEST(AdminServerSlowClientsTest, IdleAndTricklingConnectionsAreClosedAtTheirDeadline) {
  MetricsRegistry registry;
  AdminOptions o;
  o.request_timeout = std::chrono::milliseconds(300);
  auto server = AdminServer::Start(o, &registry, {});
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  int idle = testing::DialLoopback(port);
  int trickle = testing::DialLoopback(port);
  ASSERT_GE(idle, 0);
  ASSERT_GE(trickle, 0);
  auto t0 = std::chrono::steady_clock::now();
  // One byte every 100 ms never completes a head within 300 ms.
  bool closed = false;
  for (char ch : std::string("GET /healthz HTTP/1.1\r\n")) {
    if (::send(trickle, &ch, 1, MSG_NOSIGNAL) != 1 || ClosedByPeer(trickle, std::chrono::milliseconds(100))) {
      closed = true;
      break;
    }
  }
  EXPECT_TRUE(closed);
  EXPECT_TRUE(ClosedByPeer(idle, std::chrono::milliseconds(1000)));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, 0.6);
  EXPECT_EQ(registry.ValueOf("kvpool_admin_connections_timed_out_total"), 2);
  ::close(idle);
  ::close(trickle);
  EXPECT_EQ(WaitForMetric(registry, "kvpool_admin_connections", 0), 0);
}

TEST(AdminServerSlowClientsTest, AtTheCapNewConnectionsEvictTheOldestWaiting) {
  MetricsRegistry registry;
  AdminOptions o;
  o.max_connections = 50;
  auto server = AdminServer::Start(o, &registry, {});
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 60; ++i) idle.push_back(testing::DialLoopback(port));
  // Health still answers: its connection takes an idle one's place.
  EXPECT_LT(HealthzMs(port), 100);
  // 60 idle + 1 health probe through 50 slots: the 11 oldest idle ones went.
  for (int i = 0; i < 11; ++i) EXPECT_TRUE(ClosedByPeer(idle[i], std::chrono::milliseconds(1000))) << i;
  EXPECT_FALSE(ClosedByPeer(idle[11], std::chrono::milliseconds(50)));
  EXPECT_EQ(registry.ValueOf("kvpool_admin_connections_evicted_total"), 11);
  EXPECT_EQ(WaitForMetric(registry, "kvpool_admin_connections", 49), 49);
  for (int fd : idle) ::close(fd);
}

TEST(AdminServerSlowClientsTest, HealthIsServedWhileRequestThreadsAreBusyAndTheQueueIsBounded) {
  MetricsRegistry registry;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  int entered = 0;  // requests a thread has taken
  AdminHooks hooks;
  hooks.status_json = [&] {
    std::unique_lock lock(mu);
    ++entered;
    cv.wait(lock, [&] { return release; });
    return std::string("{}");
  };
  AdminOptions o;
  o.threads = 1;
  o.max_queued_requests = 2;
  auto server = AdminServer::Start(o, &registry, std::move(hooks));
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  const std::string status_req = "GET /api/v1/status HTTP/1.1\r\n\r\n";
  // One request blocks the only thread, two wait in the queue.
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(testing::DialLoopback(port));
    ASSERT_EQ(::send(held.back(), status_req.data(), status_req.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(status_req.size()));
    // The thread takes the first; the next two queue behind it.
    if (i == 0) {
      ASSERT_TRUE(testing::WaitFor([&] {
        std::lock_guard lock(mu);
        return entered == 1;
      }));
    } else {
      EXPECT_EQ(WaitForMetric(registry, "kvpool_admin_queued_requests", i), i);
    }
  }
  // The fourth finds the queue full and is told so at once.
  std::string busy = RawRequest(port, status_req);
  EXPECT_EQ(busy.substr(0, 12), "HTTP/1.1 503") << busy;
  EXPECT_NE(busy.find("Retry-After: 1\r\n"), std::string::npos);
  EXPECT_EQ(registry.ValueOf("kvpool_admin_queue_full_total"), 1);
  EXPECT_EQ(registry.ValueOf("kvpool_admin_queued_requests"), 2);
  EXPECT_LT(HealthzMs(port), 100);
  EXPECT_EQ(RawRequest(port, "GET /readyz HTTP/1.1\r\n\r\n").substr(0, 15), "HTTP/1.1 200 OK");
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  for (int fd : held) {
    std::string r = ReadAll(fd);
    EXPECT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
    EXPECT_TRUE(r.ends_with("\r\n\r\n{}")) << r;
    ::close(fd);
  }
}

TEST(AdminServerSlowClientsTest, HealthStaysFastUnderHundredsOfIdleAndTricklingConnections) {
  RaiseFdLimit();
  MetricsRegistry registry;
  AdminOptions o;
  o.request_timeout = std::chrono::milliseconds(10000);
  auto server = AdminServer::Start(o, &registry, {});
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  std::vector<int> idle, trickle;
  for (int i = 0; i < 300; ++i) idle.push_back(testing::DialLoopback(port));
  for (int i = 0; i < 300; ++i) trickle.push_back(testing::DialLoopback(port));
  std::vector<double> ms;
  for (int round = 0; round < 5; ++round) {
    for (int fd : trickle) ::send(fd, "G", 1, MSG_NOSIGNAL);
    for (int i = 0; i < 10; ++i) ms.push_back(HealthzMs(port));
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms.back(), 100) << "slowest /healthz";
  EXPECT_EQ(WaitForMetric(registry, "kvpool_admin_connections", 600), 600);
  for (int fd : idle) ::close(fd);
  for (int fd : trickle) ::close(fd);
}

// ---- external tools ------------------------------------------------------

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::filesystem::path TempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (tag + ".XXXXXX")).string();
  char* made = mkdtemp(tmpl.data());
  return made ? std::filesystem::path(made) : std::filesystem::path();
}

TEST_F(AdminServerTest, MetricsPassPromtoolCheck) {
  const char* promtool = "/usr/bin/promtool";
  if (access(promtool, X_OK) != 0) GTEST_SKIP() << "promtool not installed at " << promtool;
  auto res = client_->Get("/metrics");
  ASSERT_TRUE(res);
  auto dir = TempDir("kvpool-admin-promtool");
  ASSERT_FALSE(dir.empty());
  const auto file = dir / "metrics.txt";
  std::ofstream(file) << res->body;
  auto r = RunCommand(std::string(promtool) + " check metrics < " + file.string());
  std::filesystem::remove_all(dir);
  // promtool also lints (naming, units, _total); any output is a finding.
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "") << r.output;
}

// Text content of the element with the given id in a DOM dump ("" if absent).
std::string ElementText(const std::string& dom, const std::string& id) {
  auto at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  auto start = dom.find('>', at);
  auto end = dom.find('<', start);
  if (start == std::string::npos || end == std::string::npos) return "";
  return dom.substr(start + 1, end - start - 1);
}

std::string BodyAttribute(const std::string& dom, const std::string& name) {
  auto body = dom.find("<body");
  if (body == std::string::npos) return "";
  auto at = dom.find(name + "=\"", body);
  if (at == std::string::npos || at > dom.find('>', body)) return "";
  at += name.size() + 2;
  return dom.substr(at, dom.find('"', at) - at);
}

// An attribute of the element with the given id in a DOM dump ("" if absent).
std::string ElementAttribute(const std::string& dom, const std::string& id,
                             const std::string& name) {
  const auto at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const auto open = dom.rfind('<', at);
  const auto close = dom.find('>', at);
  auto a = dom.find(" " + name + "=\"", open);
  if (open == std::string::npos || a == std::string::npos || a > close) return "";
  a += name.size() + 3;
  return dom.substr(a, dom.find('"', a) - a);
}

// Whether the element with the given id is in the DOM dump and its tag has
// no `hidden` attribute (the page shows it).
bool ElementShown(const std::string& dom, const std::string& id) {
  const auto at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return false;
  const auto open = dom.rfind('<', at);
  const std::string tag = dom.substr(open, dom.find('>', at) - open);
  return tag.find(" hidden") == std::string::npos;
}

TEST_F(AdminServerTest, DashboardRendersValuesInHeadlessChromium) {
  const char* chromium = "/usr/bin/chromium";
  if (access(chromium, X_OK) != 0) GTEST_SKIP() << "chromium not installed at " << chromium;
  auto profile = TempDir("kvpool-admin-chromium");
  ASSERT_FALSE(profile.empty());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(history_scheduler_.RunNext());  // 3 samples, 100 ms apart
  // Every host but ours fails to resolve, so the page can only work if it
  // needs nothing beyond this node.
  const std::string cmd =
      "timeout 90 " + std::string(chromium) +
      " --headless --no-sandbox --disable-gpu --disable-extensions --no-first-run"
      " --disable-background-networking --user-data-dir=" +
      profile.string() +
      " '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'"
      " --virtual-time-budget=5000 --dump-dom http://127.0.0.1:" +
      std::to_string(server_->port()) + "/";
  auto r = RunCommand(cmd + " 2>/dev/null");
  std::filesystem::remove_all(profile);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string& dom = r.output;

  EXPECT_EQ(BodyAttribute(dom, "data-state"), "ok") << dom;
  EXPECT_GE(std::atoi(BodyAttribute(dom, "data-polls").c_str()), 2) << dom;
  EXPECT_EQ(ElementText(dom, "node-id"), "node-test-1");
  EXPECT_EQ(ElementText(dom, "uptime"), "1h 2m");
  EXPECT_EQ(ElementText(dom, "dram-capacity"), "8.00 GiB");
  EXPECT_EQ(ElementText(dom, "dram-used"), "2.00 GiB");
  EXPECT_EQ(ElementText(dom, "dram-pct"), "25.0%");
  EXPECT_EQ(ElementText(dom, "dram-entries"), "12,345");
  EXPECT_EQ(ElementText(dom, "dram-evictions"), "42");
  EXPECT_EQ(ElementText(dom, "hit-rate"), "75.0%");
  EXPECT_EQ(ElementText(dom, "hq-hit-1m"), "90.0%");
  EXPECT_EQ(ElementText(dom, "hq-hit-10m"), "80.0%");
  EXPECT_EQ(ElementText(dom, "hq-prefix-1m"), "60.0%");
  EXPECT_EQ(ElementText(dom, "hq-prefix-10m"), "55.0%");
  EXPECT_EQ(ElementText(dom, "hq-age-1m"), "\xE2\x80\x94");  // NaN: no eviction in the window
  EXPECT_EQ(ElementText(dom, "hq-age-10m"), "3m 20s");
  // The adaptation's box is shown: its tag lost `hidden`.
  EXPECT_TRUE(ElementShown(dom, "hq-adapt"));
  EXPECT_EQ(ElementText(dom, "hq-share"), "70% bimodal");
  EXPECT_EQ(ElementText(dom, "hq-share-changes"), "2");
  // Ordered by share, the bimodal one after its share's warm one, whatever
  // the exposition's order.
  EXPECT_EQ(ElementText(dom, "hq-shadows"),
            "0%: 41.0% \xC2\xB7 30%: 45.5% \xC2\xB7 50%: 44.0% \xC2\xB7 70%: 43.0% \xC2\xB7 "
            "70% bimodal: 47.0%");
  EXPECT_TRUE(ElementShown(dom, "hints-card"));  // the node holds leases
  EXPECT_EQ(ElementText(dom, "hints-retained"), "4 \xC2\xB7 4.00 MiB");
  EXPECT_EQ(ElementText(dom, "hints-pinned"), "2 \xC2\xB7 1.00 MiB");
  EXPECT_EQ(ElementText(dom, "hints-expired"), "9");
  EXPECT_EQ(ElementText(dom, "hints-prefetched"), "3");
  EXPECT_EQ(ElementText(dom, "hints-prefetch-hits"), "12");
  EXPECT_EQ(ElementText(dom, "hints-prefetch-unused"), "1");
  EXPECT_EQ(ElementText(dom, "hints-lead"), "2.5 s");
  EXPECT_EQ(ElementText(dom, "hints-refused"), "\xE2\x80\x94");  // none on /metrics
  EXPECT_EQ(ElementText(dom, "connections"), "3");
  EXPECT_EQ(ElementText(dom, "protocol-errors"), "2");
  // Counters did not move between polls.
  EXPECT_EQ(ElementText(dom, "ops-rate"), "0");
  // All ops: 100 gets in (512, 1024] us and one put above it; rank 50.5.
  EXPECT_EQ(ElementText(dom, "lat-p50"), "771 \xC2\xB5s");
  EXPECT_NE(dom.find("<tr id=\"op-get\"><td>get</td><td class=\"num\">0</td>"
                     "<td class=\"num\">1,000</td><td class=\"num\">768 \xC2\xB5s</td>"),
            std::string::npos)
      << dom;
  EXPECT_NE(dom.find("node-test-2"), std::string::npos);
  EXPECT_NE(dom.find("suspect"), std::string::npos);
  // The last 15 minutes: the charts hold the node's samples, and their
  // latest values are the ones the cards above show from /api/v1/status and
  // /metrics (nothing moved between samples: no rates, no ratio).
  EXPECT_GE(std::atoi(ElementAttribute(dom, "charts", "data-samples").c_str()), 2) << dom;
  EXPECT_EQ(ElementText(dom, "hist-dram"), ElementText(dom, "dram-used"));
  EXPECT_EQ(ElementText(dom, "hist-dram"), "2.00 GiB");
  EXPECT_EQ(ElementText(dom, "hist-ssd"), "\xE2\x80\x94");  // no SSD tier
  EXPECT_EQ(ElementText(dom, "hist-ops"), ElementText(dom, "ops-rate"));
  EXPECT_EQ(ElementText(dom, "hist-ops"), "0");
  EXPECT_EQ(ElementText(dom, "hist-evict"), "0");
  EXPECT_EQ(ElementText(dom, "hist-hit"), "\xE2\x80\x94");           // no reads in any interval
  EXPECT_EQ(ElementAttribute(dom, "chart-mem", "data-lines"), "1");  // DRAM drawn, SSD absent
  EXPECT_EQ(ElementAttribute(dom, "chart-ops", "data-lines"), "1");
  // The cluster: each member's row as /api/v1/cluster gives it, the same
  // figures the cards show for this node.
  EXPECT_EQ(ElementText(dom, "cluster-name"), "\xC2\xB7 test-cluster");
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-node"), "node-test-1 (self)");
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-dram"), "2.00 GiB of 8.00 GiB");
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-entries"), ElementText(dom, "dram-entries"));
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-hit"), ElementText(dom, "hq-hit-1m"));
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-uptime"), ElementText(dom, "uptime"));
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-clients"), ElementText(dom, "connections"));
  EXPECT_EQ(ElementText(dom, "cl-node-test-1-ops"), "1,500");
  EXPECT_EQ(ElementText(dom, "cl-node-test-2-error"), "unreachable: Unavailable: no answer");
  // The page asked for nothing but itself and its four data endpoints.
  EXPECT_EQ(Requests("other"), 0);
  EXPECT_GE(Requests("/api/v1/cluster"), 2);
  EXPECT_GE(Requests("/api/v1/status"), 2);
  EXPECT_GE(Requests("/metrics"), 2);
  EXPECT_GE(Requests("/api/v1/history"), 2);

  // A screenshot of the same page, kept as the test's artefact
  // ($KVPOOL_TEST_ARTIFACTS, else test-artifacts/ in the working directory),
  // after traffic moved for 4 s of samples so that the charts show lines: a
  // wave of gets at 90 % hits, their latencies and evictions (the status
  // JSON is fixed, so DRAM in use stays as it says).
  Counter* gets = registry_.GetCounter("kvpool_ops_total", "", {{"op", "get"}});
  Counter* hits = registry_.GetCounter("kvpool_hits_total", "");
  Counter* misses = registry_.GetCounter("kvpool_misses_total", "");
  Counter* read = registry_.GetCounter("kvpool_bytes_read_total", "");
  Counter* evicted = registry_.GetCounter("kvpool_dram_evictions_total", "");
  Histogram* lat = registry_.GetHistogram("kvpool_op_latency_seconds", "", {{"op", "get"}});
  for (int step = 0; step < 200; ++step) {  // 5 steps per 100 ms sample
    const int n = 200 + static_cast<int>(150 * std::sin(step / 8.0));
    gets->Inc(n);
    hits->Inc(n * 9 / 10);
    misses->Inc(n - n * 9 / 10);
    read->Inc(static_cast<uint64_t>(n) << 16);
    evicted->Inc(n / 20);
    for (int i = 0; i < n; ++i) {
      lat->Observe(0.0004 + 0.0003 * (i % 7) / 7.0 + (i % 100 == 0 ? 0.004 : 0));
    }
    if (step % 5 == 4) {
      ASSERT_TRUE(history_scheduler_.RunNext());
    }
  }
  // Still counters before the shot: the page's own rates run on the
  // browser's virtual clock, so only they give the cards true values; the
  // charts keep the traffic of the samples before.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(history_scheduler_.RunNext());
  const char* dir_env = std::getenv("KVPOOL_TEST_ARTIFACTS");
  const std::filesystem::path dir = dir_env != nullptr ? dir_env : "test-artifacts";
  std::filesystem::create_directories(dir);
  const std::filesystem::path png = std::filesystem::absolute(dir / "dashboard.png");
  std::filesystem::remove(png);
  auto shot_profile = TempDir("kvpool-admin-chromium-shot");
  ASSERT_FALSE(shot_profile.empty());
  auto shot =
      RunCommand("timeout 90 " + std::string(chromium) +
                 " --headless --no-sandbox --disable-gpu --disable-extensions"
                 " --no-first-run --disable-background-networking --hide-scrollbars"
                 " --user-data-dir=" +
                 shot_profile.string() +
                 " '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'"
                 " --window-size=1400,1700 --virtual-time-budget=5000 --screenshot=" +
                 png.string() + " http://127.0.0.1:" + std::to_string(server_->port()) + "/ 2>&1");
  std::filesystem::remove_all(shot_profile);
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  std::ifstream f(png, std::ios::binary);
  std::string head(8, '\0');
  f.read(head.data(), 8);
  EXPECT_EQ(head, std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(std::filesystem::file_size(png), 20000u) << png;
  std::printf("dashboard screenshot: %s\n", png.c_str());
}

}  // namespace
}  // namespace kvpool
