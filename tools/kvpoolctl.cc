// kvpoolctl: admin CLI for one kvpool node.
//   kvpoolctl [--socket PATH] [--timeout DURATION] COMMAND ...
//   put NS KEY (--value TEXT | --file PATH | -)   store a value (- reads stdin)
//   get NS KEY [--out FILE]                        print the value (raw bytes)
//   exists NS KEY...                               per-key 1/0 and the hit prefix
//   remove NS KEY...                               drop keys
//   stat                                           the node's statistics (JSON)
//   flush                                          write the SSD tier's open regions
//   clear NS                                       drop every key of namespace NS
//   metrics [--admin HOST:PORT]                    the node's Prometheus metrics
//   members [--admin HOST:PORT]                    the cluster members the node sees
//   shards [--admin HOST:PORT]                     shards owned per node and the balance
//   tenants [--admin HOST:PORT]                    per tenant: quotas, use, traffic
// Exit status: 0 done, 1 a miss, 2 usage, 3 an error.
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "common/secret_file.h"
#include "common/settings.h"
#include "kvpool/kvpool.h"

namespace {

// To stdout when asked for (--help), else to stderr as a usage error.
int Usage(FILE* out = stderr) {
  std::fputs(
      "usage: kvpoolctl [--socket PATH] [--timeout DURATION] COMMAND ...\n"
      "  --timeout: deadline of each call (5s, 500ms; a bare number is milliseconds; default 5s)\n"
      "  put NS KEY (--value TEXT | --file PATH | -)   store a value (- reads stdin)\n"
      "  get NS KEY [--out FILE]                        print the value (raw bytes)\n"
      "  exists NS KEY...                               per-key 1/0 and the hit prefix\n"
      "  remove NS KEY...                               drop keys\n"
      "  stat                                           the node's statistics (JSON)\n"
      "  flush                                          write the SSD tier's open regions\n"
      "  clear NS                                       drop every key of namespace NS\n"
      "  metrics [--admin HOST:PORT]                    Prometheus metrics (default 127.0.0.1:9710)\n"
      "  members [--admin HOST:PORT]                    cluster members the node sees\n"
      "  shards [--admin HOST:PORT]                     shards owned per node and the balance\n"
      "  tenants [--admin HOST:PORT]                    per tenant: quotas, use, traffic\n"
      "  (metrics, members, shards, tenants: --token-file PATH sends the node's admin bearer "
      "token)\n"
      "exit status: 0 done, 1 a miss, 2 usage, 3 an error\n",
      out);
  return 2;
}

int Error(const char* what, kvpool_status st) {
  std::fprintf(stderr, "kvpoolctl: %s: %s (%s)\n", what, kvpool_status_name(st), kvpool_last_error());
  return 3;
}

kvpool_key_id Id(const std::string& ns, const std::string& key) {
  const void* p = key.data();
  size_t len = key.size();
  kvpool_key_id id;
  kvpool_key_ids(ns.data(), ns.size(), &p, &len, 1, &id);
  return id;
}

// The admin endpoint and the bearer token to send it (empty: none).
struct Admin {
  std::string address = "127.0.0.1:9710";
  std::string token;
};

// GETs path from the admin endpoint into *body; false (with a message) on failure.
bool AdminGet(const Admin& a, const std::string& path, std::string* body) {
  const std::string& admin = a.address;
  auto colon = admin.rfind(':');
  int port = colon == std::string::npos ? 0 : std::atoi(admin.c_str() + colon + 1);
  if (port <= 0) {
    std::fprintf(stderr, "kvpoolctl: --admin wants HOST:PORT, got '%s'\n", admin.c_str());
    return false;
  }
  httplib::Client http(admin.substr(0, colon), port);
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  if (!a.token.empty()) http.set_bearer_token_auth(a.token);
  auto res = http.Get(path);
  if (res && res->status == 401) {
    std::fprintf(stderr, "kvpoolctl: http://%s%s needs the node's admin token (%s)\n",
                 admin.c_str(), path.c_str(), a.token.empty() ? "give --token-file" : "wrong token");
    return false;
  }
  if (!res || res->status != 200) {
    std::fprintf(stderr, "kvpoolctl: cannot fetch http://%s%s\n", admin.c_str(), path.c_str());
    return false;
  }
  *body = std::move(res->body);
  return true;
}

int Metrics(const Admin& admin) {
  std::string body;
  if (!AdminGet(admin, "/metrics", &body)) return 3;
  std::fwrite(body.data(), 1, body.size(), stdout);
  return 0;
}

// members: one line per member; shards: owned shards per node, its share
// of the total, and the balance (largest owner over the mean).
int Members(const Admin& admin, bool shards) {
  std::string body;
  if (!AdminGet(admin, "/api/v1/members", &body)) return 3;
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("members") || !j.contains("shards")) {
    std::fprintf(stderr, "kvpoolctl: malformed /api/v1/members reply\n");
    return 3;
  }
  if (!shards) {
    std::printf("%-24s %-24s %-20s %s\n", "NODE", "ADDRESS", "INCARNATION", "STATE");
    for (const auto& m : j["members"]) {
      std::printf("%-24s %-24s %-20llu %s%s\n", m.value("node_id", "").c_str(),
                  m.value("address", "").c_str(),
                  static_cast<unsigned long long>(m.value("incarnation", uint64_t{0})),
                  m.value("state", "").c_str(), m.value("self", false) ? " (self)" : "");
    }
    std::printf("epoch %llu, %zu members\n",
                static_cast<unsigned long long>(j.value("epoch", uint64_t{0})),
                j["members"].size());
    if (j.value("fenced", false)) {
      std::printf("this node is fenced: its lease is not renewed, it does no remote work\n");
    } else if (j.value("etcd_outage", false)) {
      std::printf("etcd is unreachable for this node and its peers: serving with this view\n");
    }
    return 0;
  }
  const auto& owned = j["shards"]["owned"];
  uint64_t total = j["shards"].value("total", uint64_t{0});
  uint64_t max = 0, owners = 0;
  std::printf("%-24s %8s %8s\n", "NODE", "SHARDS", "SHARE");
  for (const auto& [id, n] : owned.items()) {
    uint64_t c = n.get<uint64_t>();
    max = std::max(max, c);
    owners += c > 0;
    std::printf("%-24s %8llu %7.2f%%\n", id.c_str(), static_cast<unsigned long long>(c),
                total ? 100.0 * static_cast<double>(c) / static_cast<double>(total) : 0.0);
  }
  double mean = owners ? static_cast<double>(total) / static_cast<double>(owners) : 0.0;
  std::printf("total %llu shards over %llu nodes, balance (max/mean) %.3f\n",
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(owners),
              mean > 0 ? static_cast<double>(max) / mean : 0.0);
  return 0;
}

// tenants: one line per tenant (the default one first): connections, DRAM
// and SSD use against the quota, evictions, and item traffic.
int Tenants(const Admin& admin) {
  std::string body;
  if (!AdminGet(admin, "/api/v1/status", &body)) return 3;
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("tenants") || !j["tenants"].is_array()) {
    std::fprintf(stderr, "kvpoolctl: malformed /api/v1/status reply (no tenants)\n");
    return 3;
  }
  auto size = [](const nlohmann::json& tier, const char* field) {
    if (tier.is_null()) return std::string("-");
    return kvpool::SettingsTable::FormatBytes(tier.value(field, uint64_t{0}));
  };
  auto u = [](const nlohmann::json& o, const char* field) {
    return static_cast<unsigned long long>(o.is_null() ? 0 : o.value(field, uint64_t{0}));
  };
  std::printf("%-16s %5s %10s %10s %9s %9s %10s %10s %10s %10s %9s\n", "TENANT", "CONNS",
              "DRAM", "QUOTA", "ENTRIES", "EVICTED", "SSD", "QUOTA", "HITS", "MISSES", "REJECTED");
  for (const auto& t : j["tenants"]) {
    const auto& d = t["dram"];
    const auto& s = t["ssd"];
    std::printf("%-16s %5llu %10s %10s %9llu %9llu %10s %10s %10llu %10llu %9llu\n",
                t.value("name", "").c_str(), u(t, "connections"), size(d, "used_bytes").c_str(),
                size(d, "quota_bytes").c_str(), u(d, "entries"), u(d, "evictions"),
                size(s, "used_bytes").c_str(), size(s, "quota_bytes").c_str(), u(t, "hits"),
                u(t, "misses"), u(t, "rejected"));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path;  // empty: libkvpool's default, where the node puts it
  uint32_t timeout_ms = 5000;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) socket_path = argv[++i];
    else if (a.rfind("--socket=", 0) == 0) socket_path = a.substr(9);
    else if ((a == "--timeout" && i + 1 < argc) || a.rfind("--timeout=", 0) == 0) {
      // The node's duration parser: a bare number is milliseconds.
      const std::string text = a == "--timeout" ? std::string(argv[++i]) : a.substr(10);
      kvpool::Result<std::chrono::milliseconds> t = kvpool::SettingsTable::ParseDuration("timeout", text);
      if (!t.ok()) {
        std::fprintf(stderr, "kvpoolctl: %s\n", std::string(t.status().message()).c_str());
        return 2;
      }
      if (t->count() <= 0 || t->count() > static_cast<int64_t>(UINT32_MAX)) {
        std::fprintf(stderr, "kvpoolctl: --timeout: %lldms is outside 1ms..%ums\n",
                     static_cast<long long>(t->count()), UINT32_MAX);
        return 2;
      }
      timeout_ms = static_cast<uint32_t>(t->count());
    }
    else if (a == "-h" || a == "--help") return Usage(stdout), 0;
    else args.push_back(a);
  }
  if (args.empty()) return Usage();
  const std::string cmd = args[0];
  if (cmd == "metrics" || cmd == "members" || cmd == "shards" || cmd == "tenants") {
    Admin admin;
    std::string token_file;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--admin" && i + 1 < args.size()) admin.address = args[++i];
      else if (args[i].rfind("--admin=", 0) == 0) admin.address = args[i].substr(8);
      else if (args[i] == "--token-file" && i + 1 < args.size()) token_file = args[++i];
      else return Usage();
    }
    if (!token_file.empty()) {
      std::ifstream in(token_file);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::vector<std::string> lines = kvpool::SecretLines(text);
      if (!in.good() && text.empty()) {
        std::fprintf(stderr, "kvpoolctl: cannot read %s\n", token_file.c_str());
        return 3;
      }
      if (lines.empty()) {
        std::fprintf(stderr, "kvpoolctl: %s holds no token\n", token_file.c_str());
        return 3;
      }
      admin.token = lines.front();
    }
    if (cmd == "metrics") return Metrics(admin);
    if (cmd == "tenants") return Tenants(admin);
    return Members(admin, cmd == "shards");
  }

  if (cmd != "put" && cmd != "get" && cmd != "exists" && cmd != "remove" && cmd != "stat" &&
      cmd != "flush" && cmd != "clear") {
    return Usage();
  }
  kvpool_options opts;
  kvpool_options_init(&opts);
  opts.socket_path = socket_path.empty() ? nullptr : socket_path.c_str();
  opts.timeout_ms = timeout_ms;
  opts.max_connections = 1;
  kvpool_status st;
  kvpool_client* c = kvpool_open(&opts, &st);
  if (c == nullptr) return Error("cannot connect", st);
  std::unique_ptr<kvpool_client, void (*)(kvpool_client*)> guard(c, kvpool_close);

  if (cmd == "put") {
    if (args.size() < 4) return Usage();
    std::string value;
    if (args[3] == "--value" && args.size() == 5) {
      value = args[4];
    } else if (args[3] == "--file" && args.size() == 5) {
      std::ifstream in(args[4], std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "kvpoolctl: cannot read %s\n", args[4].c_str());
        return 3;
      }
      value.assign(std::istreambuf_iterator<char>(in), {});
    } else if (args[3] == "-" && args.size() == 4) {
      value.assign(std::istreambuf_iterator<char>(std::cin), {});
    } else {
      return Usage();
    }
    kvpool_key_id id = Id(args[1], args[2]);
    const void* v = value.data();
    uint64_t size = value.size();
    kvpool_status item;
    st = kvpool_put(c, &id, &v, &size, 1, &item);
    if (st == KVPOOL_OK && item == KVPOOL_ALREADY_EXISTS) {
      std::fputs("exists (kept the first value)\n", stderr);
      return 0;
    }
    if (st != KVPOOL_OK) return Error("put", st);
    return 0;
  }
  if (cmd == "get") {
    if (args.size() != 3 && !(args.size() == 5 && args[3] == "--out")) return Usage();
    kvpool_key_id id = Id(args[1], args[2]);
    uint64_t cap = kvpool_max_value_size(c), size = 0;
    std::vector<char> buf(cap);
    void* b = buf.data();
    kvpool_status item;
    st = kvpool_get(c, &id, &b, &cap, 1, &size, &item);
    if (st != KVPOOL_OK) return Error("get", st);
    if (item == KVPOOL_NOT_FOUND) {
      std::fputs("not found\n", stderr);
      return 1;
    }
    if (item != KVPOOL_OK) return Error("get", item);
    if (args.size() == 5) {
      std::ofstream out(args[4], std::ios::binary);
      out.write(buf.data(), static_cast<std::streamsize>(size));
      if (!out) return 3;
    } else {
      std::fwrite(buf.data(), 1, size, stdout);
    }
    return 0;
  }
  if (cmd == "exists" || cmd == "remove") {
    if (args.size() < 3) return Usage();
    std::vector<kvpool_key_id> ids;
    for (size_t i = 2; i < args.size(); ++i) ids.push_back(Id(args[1], args[i]));
    if (cmd == "exists") {
      std::vector<uint8_t> hits(ids.size());
      size_t prefix = 0;
      st = kvpool_exists(c, ids.data(), ids.size(), hits.data(), &prefix);
      if (st != KVPOOL_OK) return Error("exists", st);
      for (size_t i = 0; i < ids.size(); ++i) std::printf("%s %d\n", args[i + 2].c_str(), hits[i]);
      std::printf("prefix %zu\n", prefix);
      return prefix == ids.size() ? 0 : 1;
    }
    std::vector<kvpool_status> sts(ids.size());
    st = kvpool_remove(c, ids.data(), ids.size(), sts.data());
    if (st != KVPOOL_OK) return Error("remove", st);
    int rc = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::printf("%s %s\n", args[i + 2].c_str(), kvpool_status_name(sts[i]));
      if (sts[i] != KVPOOL_OK) rc = 1;
    }
    return rc;
  }
  if (cmd == "clear") {
    if (args.size() != 2) return Usage();
    uint64_t dropped = 0;
    st = kvpool_clear_namespace(c, args[1].data(), args[1].size(), &dropped);
    if (st != KVPOOL_OK) return Error("clear", st);
    std::printf("cleared %s: %llu entries dropped\n", args[1].c_str(),
                static_cast<unsigned long long>(dropped));
    return 0;
  }
  if (cmd == "flush") {
    st = kvpool_flush(c);
    if (st != KVPOOL_OK) return Error("flush", st);
    return 0;
  }
  if (cmd == "stat") {
    size_t len = 0;
    std::vector<char> buf(1 << 16);
    st = kvpool_stats_json(c, buf.data(), buf.size(), &len);
    if (st == KVPOOL_RESOURCE_EXHAUSTED) {
      buf.resize(len + 1);
      st = kvpool_stats_json(c, buf.data(), buf.size(), &len);
    }
    if (st != KVPOOL_OK) return Error("stat", st);
    std::printf("%s\n", buf.data());
    return 0;
  }
  return Usage();
}
