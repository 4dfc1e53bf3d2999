#include "admin/admin_server.h"

#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "gtest/gtest.h"

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
  r->GetCounter("kvpool_protocol_errors_total", "Malformed requests, by reason.",
                {{"reason", "bad_magic"}})
      ->Inc(2);
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
        {"index_bytes_per_entry", 96}}},
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
    auto server = AdminServer::Start(AdminOptions{}, &registry_, std::move(hooks));
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

TEST_F(AdminServerTest, DashboardRendersValuesInHeadlessChromium) {
  const char* chromium = "/usr/bin/chromium";
  if (access(chromium, X_OK) != 0) GTEST_SKIP() << "chromium not installed at " << chromium;
  auto profile = TempDir("kvpool-admin-chromium");
  ASSERT_FALSE(profile.empty());
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
  // The page asked for nothing but itself and its two data endpoints.
  EXPECT_EQ(Requests("other"), 0);
  EXPECT_GE(Requests("/api/v1/status"), 2);
  EXPECT_GE(Requests("/metrics"), 2);
}

}  // namespace
}  // namespace kvpool
