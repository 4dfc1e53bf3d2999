// kvpool-etcd-load: the load N nodes' memberships put on a real etcd
// (docs/scale.md). For each N it starts an etcd of its own (a temporary
// directory, free loopback ports), registers N EtcdMemberships as
// kvpool-node does (one loop thread each, --lease-ttl), waits until every
// one sees all N, then counts the requests etcd served over --seconds from
// its own /metrics (grpc_server_started_total, by method; the HTTP API
// kvpool uses goes through it). Then one more node joins and, later, one
// node crashes (its lease left to expire): how long until every other
// node's view has it, and has it no more. Prints one JSON object per N:
//   {"nodes", "lease_ttl_s", "seconds", "requests_per_s", "by_method": {...},
//    "lease_renewals_per_s", "join_seen_by_all_s", "crash_gone_from_all_s"}
// Used by bench/compare.sh scale --etcd.
#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "membership/etcd_membership.h"
#include "membership/etcd_test_util.h"

namespace {

using kvpool::EtcdMembership;
using kvpool::EtcdMembershipOptions;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct LoadNode {
  std::unique_ptr<EtcdMembership> m;
  std::thread loop;
  void Stop(EtcdMembership::LeaveMode mode) {
    if (!loop.joinable()) return;
    m->Stop(mode);
    loop.join();
  }
  ~LoadNode() { Stop(EtcdMembership::LeaveMode::kRevokeLease); }
};

// etcd's request counters by gRPC method, from its /metrics.
std::map<std::string, double> EtcdRequests(const std::string& endpoint) {
  std::map<std::string, double> out;
  const std::string cmd = "curl -s --max-time 5 " + endpoint + "/metrics";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  static const std::regex line(
      R"re(^grpc_server_started_total\{.*grpc_method="(\w+)".*\} (\S+))re");
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) {
    std::cmatch m;
    if (std::regex_search(buf, m, line)) out[m[1].str()] += std::stod(m[2].str());
  }
  pclose(p);
  return out;
}

// Seconds until pred holds, polling; -1 past the limit.
template <typename Pred>
double SecondsUntil(Clock::time_point t0, std::chrono::seconds limit, Pred pred) {
  while (!pred()) {
    if (Clock::now() - t0 > limit) return -1;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvpool-etcd-load: the load N nodes' memberships put on etcd (docs/scale.md)"};
  std::vector<size_t> sizes = {4, 16, 64};
  int seconds = 10;
  int ttl_s = 10;
  app.add_option("--nodes", sizes, "cluster sizes")->delimiter(',');
  app.add_option("--seconds", seconds, "how long requests are counted")->check(CLI::Range(1, 600));
  app.add_option("--lease-ttl", ttl_s, "lease TTL in seconds (kvpool-node's default: 10)")
      ->check(CLI::Range(2, 600));
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);  // as kvpool-node does

  for (size_t n : sizes) {
    auto etcd = kvpool::EtcdTestServer::Start();
    if (!etcd.ok()) {
      std::fprintf(stderr, "kvpool-etcd-load: %s\n", etcd.status().ToString().c_str());
      return 1;
    }
    kvpool::MetricsRegistry metrics;
    auto options = [&](size_t i) {
      EtcdMembershipOptions o;
      o.endpoints = {(*etcd)->endpoint()};
      o.cluster = "load";
      o.node_id = "n" + std::to_string(i);
      o.address = "127.0.0.1:" + std::to_string(20000 + i);
      o.lease_ttl = std::chrono::seconds(ttl_s);
      return o;
    };
    std::vector<std::unique_ptr<LoadNode>> nodes;
    auto add = [&](size_t i) -> bool {
      auto m = EtcdMembership::Open(options(i), &metrics);
      if (!m.ok()) {
        std::fprintf(stderr, "kvpool-etcd-load: N=%zu: %s\n", n, m.status().ToString().c_str());
        return false;
      }
      auto node = std::make_unique<LoadNode>();
      node->m = std::move(m).value();
      LoadNode* raw = node.get();
      node->loop = std::thread([raw] { raw->m->Run(); });
      nodes.push_back(std::move(node));
      return true;
    };
    for (size_t i = 0; i < n; ++i) {
      if (!add(i)) return 1;
    }
    auto all_see = [&](size_t count, size_t skip) {
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (i != skip && nodes[i]->m->view()->members.size() != count) return false;
      }
      return true;
    };
    if (SecondsUntil(Clock::now(), std::chrono::seconds(60), [&] { return all_see(n, n); }) < 0) {
      std::fprintf(stderr, "kvpool-etcd-load: N=%zu: views did not converge in 60 s\n", n);
      return 1;
    }
    auto* renewals = metrics.GetCounter("kvpool_membership_lease_renewals_total", "");
    const auto renewed0 = renewals->Value();
    const auto before = EtcdRequests((*etcd)->endpoint());
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    const auto after = EtcdRequests((*etcd)->endpoint());
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto renewed = static_cast<double>(renewals->Value() - renewed0);
    nlohmann::json by_method = nlohmann::json::object();
    double total = 0;
    for (const auto& [method, v] : after) {
      auto b = before.find(method);
      const double d = v - (b == before.end() ? 0.0 : b->second);
      if (d <= 0) continue;
      by_method[method] = d / secs;
      total += d;
    }
    // One more joins: until every node sees it.
    const auto tj = Clock::now();
    if (!add(n)) return 1;
    const double join_s =
        SecondsUntil(tj, std::chrono::seconds(60), [&] { return all_see(n + 1, n + 1); });
    // One crashes (its lease is left to expire): until nobody sees it.
    const auto tc = Clock::now();
    nodes[0]->Stop(EtcdMembership::LeaveMode::kAbandonLease);
    const double crash_s =
        SecondsUntil(tc, std::chrono::seconds(3 * ttl_s + 30), [&] { return all_see(n, 0); });
    nlohmann::json j = {{"nodes", n},
                        {"lease_ttl_s", ttl_s},
                        {"seconds", secs},
                        {"requests_per_s", total / secs},
                        {"by_method", by_method},
                        {"lease_renewals_per_s", renewed / secs},
                        {"join_seen_by_all_s", join_s},
                        {"crash_gone_from_all_s", crash_s}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    for (auto& node : nodes) node->Stop(EtcdMembership::LeaveMode::kRevokeLease);
  }
  return 0;
}
