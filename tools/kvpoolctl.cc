// kvpoolctl: admin CLI for one kvpool node.
//   kvpoolctl [--socket PATH] [--timeout DURATION] COMMAND ...
//   put NS KEY (--value TEXT | --file PATH | -)   store a value (- reads stdin)
//   get NS KEY [--out FILE]                        print the value (raw bytes)
//   exists NS KEY...                               per-key 1/0 and the hit prefix
//   remove NS KEY...                               drop keys
//   stat [--json]                                  the node's key figures (a table; --json: all)
//   flush                                          write the SSD tier's open regions
//   clear NS                                       drop every key of namespace NS
//   lookup HASH... [--json]                        which nodes hold the longest run of these engine
//   blocks metrics [--admin HOST:PORT]                    the node's Prometheus metrics members
//   [--admin HOST:PORT] [--json]           the cluster members the node sees shards [--admin
//   HOST:PORT] [--json]            shards owned per node and the balance tenants [--admin
//   HOST:PORT] [--json]           per tenant: quotas, use, traffic clients [--admin HOST:PORT]
//   [--json]           connected engines and their traffic top [--admin HOST:PORT] [--interval D]
//   [--count N]  key figures, refreshed
//   retain|pin|release NS KEY... [--ttl D] ...    cache hints (POST /api/v1/hints)
// Every command takes --help. Durations and sizes read as the node's do.
// Exit status: 0 done, 1 a miss, 2 usage, 3 an error.
#include <httplib.h>
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
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/secret_file.h"
#include "common/settings.h"
#include "kvpool/kvpool.h"

namespace {

// One command's synopsis and what it does, for the usage and --help.
struct Command {
  const char* name;
  const char* args;
  const char* what;
};
constexpr Command kCommands[] = {
    {"put", "NS KEY (--value TEXT | --file PATH | -)", "store a value (- reads stdin)"},
    {"get", "NS KEY [--out FILE]",
     "print the value (raw bytes; a newline after it only on a terminal)"},
    {"exists", "NS KEY...", "per-key 1/0 and the hit prefix"},
    {"remove", "NS KEY...", "drop keys"},
    {"stat", "[--json]", "the node's key figures (a table; --json: everything, as JSON)"},
    {"flush", "", "write the SSD tier's open regions"},
    {"clear", "NS", "drop every key of namespace NS"},
    {"lookup", "HASH... [--json]",
     "a router's prefix lookup: the nodes holding the longest leading run of these engine "
     "block hashes (decimal or 0x hex), and in which tier (1: none holds the first)"},
    {"metrics", "[--admin HOST:PORT]", "Prometheus metrics (default 127.0.0.1:9710)"},
    {"members", "[--admin HOST:PORT] [--json]", "cluster members the node sees"},
    {"shards", "[--admin HOST:PORT] [--json]", "shards owned per node and the balance"},
    {"tenants", "[--admin HOST:PORT] [--json]", "per tenant: quotas, use, traffic"},
    {"clients", "[--admin HOST:PORT] [--json]",
     "connected engines: pid, user, name, tenant, connection age, ops, bytes"},
    {"top", "[--admin HOST:PORT] [--interval DURATION] [--count N]",
     "key figures refreshed every interval (default 1s; N frames, default until ^C)"},
    {"retain", "NS KEY... --ttl DURATION [--priority N] [--tenant NAME] [--admin HOST:PORT]",
     "cache hint: keep the keys last in DRAM's eviction order for the TTL (priority 0..255: "
     "higher is kept longer)"},
    {"pin", "NS KEY... --ttl DURATION [--tenant NAME] [--admin HOST:PORT]",
     "cache hint: DRAM does not evict the keys for the TTL (within --pin-max-bytes)"},
    {"prefetch", "NS KEY... [--tenant NAME] [--admin HOST:PORT]",
     "cache hint: bring the keys held on this node's SSD into DRAM now (answered once there)"},
    {"demote", "NS KEY... [--tenant NAME] [--admin HOST:PORT]",
     "cache hint: move the keys from DRAM to SSD now (without an SSD tier: first in line to "
     "go)"},
    {"release", "NS KEY... [--tenant NAME] [--admin HOST:PORT]",
     "cache hint: end the keys' retention, pin or demotion now"},
};

const Command* FindCommand(const std::string& name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

// To stdout when asked for (--help), else to stderr as a usage error.
int Usage(FILE* out = stderr) {
  std::fputs(
      "usage: kvpoolctl [--socket PATH] [--timeout DURATION] COMMAND ...\n"
      "  --socket: the node's socket (default $KVPOOL_SOCKET, else where the node puts it)\n"
      "  --timeout: deadline of each call (5s, 500ms; a bare number is milliseconds; "
      "default 5s)\n",
      out);
  for (const Command& c : kCommands) {
    const std::string synopsis = std::string(c.name) + (*c.args ? " " : "") + c.args;
    std::fprintf(out, "  %-46s %s\n", synopsis.c_str(), c.what);
  }
  std::fputs(
      "  (metrics, members, shards, tenants, clients, top, retain, pin, release: --token-file "
      "PATH sends the node's admin bearer token)\n"
      "  kvpoolctl COMMAND --help: that command alone\n"
      "exit status: 0 done, 1 a miss, 2 usage, 3 an error\n",
      out);
  return 2;
}

// kvpoolctl COMMAND --help.
int CommandHelp(const Command& c) {
  std::printf("usage: kvpoolctl [--socket PATH] [--timeout DURATION] %s%s%s\n  %s\n", c.name,
              *c.args ? " " : "", c.args, c.what);
  if (std::strstr(c.args, "--admin") != nullptr) {
    std::puts(
        "  --admin HOST:PORT: the node's admin endpoint (default 127.0.0.1:9710)\n"
        "  --token-file PATH: the admin bearer token, when the node has one");
  }
  return 0;
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

// A client of the admin endpoint, with the token; null (with a message)
// for an address that is not HOST:PORT.
std::unique_ptr<httplib::Client> AdminClient(const Admin& a) {
  const std::string& admin = a.address;
  auto colon = admin.rfind(':');
  int port = colon == std::string::npos ? 0 : std::atoi(admin.c_str() + colon + 1);
  if (port <= 0) {
    std::fprintf(stderr, "kvpoolctl: --admin wants HOST:PORT, got '%s'\n", admin.c_str());
    return nullptr;
  }
  auto http = std::make_unique<httplib::Client>(admin.substr(0, colon), port);
  http->set_connection_timeout(5);
  http->set_read_timeout(5);
  if (!a.token.empty()) http->set_bearer_token_auth(a.token);
  return http;
}

// GETs path from the admin endpoint into *body; false (with a message) on failure.
bool AdminGet(const Admin& a, const std::string& path, std::string* body) {
  const std::string& admin = a.address;
  auto http = AdminClient(a);
  if (http == nullptr) return false;
  auto res = http->Get(path);
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

// GETs a JSON object from the admin endpoint into *j; false (with a
// message) when the fetch fails or the reply is not one, or lacks `field`.
bool AdminJson(const Admin& a, const std::string& path, nlohmann::json* j,
               const char* field = nullptr) {
  std::string body;
  if (!AdminGet(a, path, &body)) return false;
  *j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j->is_discarded() || !j->is_object() || (field != nullptr && !j->contains(field))) {
    std::fprintf(stderr, "kvpoolctl: malformed %s reply%s%s\n", path.c_str(),
                 field != nullptr ? ": no " : "", field != nullptr ? field : "");
    return false;
  }
  return true;
}

// kvpoolctl retain|pin|prefetch|demote|release: one cache hint (POST
// /api/v1/hints). Prints what it applied to; exit 3 when the node refuses
// it.
int Hint(const Admin& a, const nlohmann::json& hint) {
  auto http = AdminClient(a);
  if (http == nullptr) return 3;
  auto res = http->Post("/api/v1/hints", hint.dump(), "application/json");
  if (!res) {
    std::fprintf(stderr, "kvpoolctl: cannot reach http://%s\n", a.address.c_str());
    return 3;
  }
  const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (res->status != 200) {
    const std::string why = j.is_object() && j.contains("error") && j["error"].is_string()
                                ? j["error"].get<std::string>()
                                : res->body;
    std::fprintf(stderr, "kvpoolctl: %s refused (HTTP %d): %s\n",
                 hint["op"].get<std::string>().c_str(), res->status, why.c_str());
    return 3;
  }
  if (!j.is_object() || !j.contains("applied") || !j.contains("unknown")) {
    std::fprintf(stderr, "kvpoolctl: malformed hint reply\n");
    return 3;
  }
  const std::string op = hint["op"].get<std::string>();
  const auto n = [&](const char* field) {
    return static_cast<unsigned long long>(j.value(field, uint64_t{0}));
  };
  if (op == "prefetch") {
    std::printf("in DRAM %llu (brought in %llu), not held %llu\n", n("applied"), n("moved"),
                n("unknown"));
    return 0;
  }
  std::printf("applied %llu, not in DRAM %llu", n("applied"), n("unknown"));
  if (op == "demote" && n("moved") > 0) std::printf(", moved to SSD %llu", n("moved"));
  const uint64_t clipped = j.value("clipped", uint64_t{0});
  if (clipped > 0) {
    std::printf(", %llu retentions ended by --retain-max-percent",
                static_cast<unsigned long long>(clipped));
  }
  std::printf("\n");
  return 0;
}

// A hash as a router writes it: decimal, or 0x and hex (its last 16 digits).
bool ParseHash(const std::string& s, uint64_t* out) {
  const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  if (s.empty() || (hex ? s.size() > 66 : s.size() > 20)) return false;
  unsigned __int128 v = 0;
  for (size_t i = hex ? 2 : 0; i < s.size(); ++i) {
    const char c = s[i];
    int d = c >= '0' && c <= '9'          ? c - '0'
            : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
            : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : -1;
    if (d < 0) return false;
    v = hex ? ((v << 4) | static_cast<unsigned>(d)) & UINT64_MAX
            : v * 10 + static_cast<unsigned>(d);
  }
  if (v > UINT64_MAX) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

// kvpoolctl lookup: exit 0 when a node holds the first block, 1 when none does.
int Lookup(kvpool_client* c, const std::vector<uint64_t>& hashes, bool json) {
  std::vector<char> buf(4096 + 64 * hashes.size());
  size_t len = 0;
  kvpool_status st =
      kvpool_lookup_prefix(c, hashes.data(), hashes.size(), 0, buf.data(), buf.size(), &len);
  if (st == KVPOOL_RESOURCE_EXHAUSTED && len + 1 > buf.size()) {
    buf.resize(len + 1);
    st = kvpool_lookup_prefix(c, hashes.data(), hashes.size(), 0, buf.data(), buf.size(), &len);
  }
  if (st != KVPOOL_OK) return Error("lookup", st);
  nlohmann::json j = nlohmann::json::parse(buf.data(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    std::fprintf(stderr, "kvpoolctl: malformed lookup answer\n");
    return 3;
  }
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%-24s %-24s %8s %8s %8s  %s\n", "NODE", "ADDRESS", "BLOCKS", "DRAM", "SSD",
                "TIERS");
    for (const auto& h : j.value("holders", nlohmann::json::array())) {
      std::printf("%-24s %-24s %8u %8u %8u  %s\n", h.value("node", "").c_str(),
                  h.value("address", "").c_str(), h.value("blocks", 0u), h.value("dram", 0u),
                  h.value("ssd", 0u), h.value("tiers", "").c_str());
    }
    std::printf("longest %u of %u blocks", j.value("longest", 0u), j.value("blocks", 0u));
    if (j.value("homes_failed", 0u) > 0) {
      std::printf(" (%u of %u index homes did not answer)", j.value("homes_failed", 0u),
                  j.value("homes", 0u));
    }
    std::printf("\n");
  }
  return j.value("longest", 0u) > 0 ? 0 : 1;
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
  nlohmann::json j;
  if (!AdminJson(admin, "/api/v1/members", &j, "members")) return 3;
  if (!j.contains("shards")) {
    std::fprintf(stderr, "kvpoolctl: malformed /api/v1/members reply: no shards\n");
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
  nlohmann::json j;
  if (!AdminJson(admin, "/api/v1/status", &j, "tenants") || !j["tenants"].is_array()) return 3;
  if (j.contains("tenants_hidden")) {
    std::fprintf(stderr, "kvpoolctl: tenants: %s\n", j.value("tenants_hidden", "").c_str());
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

std::string Duration(double seconds) {
  auto s = static_cast<uint64_t>(seconds);
  char out[64];
  if (s >= 86400) {
    std::snprintf(out, sizeof(out), "%llud %lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s % 86400 / 3600));
  } else if (s >= 3600) {
    std::snprintf(out, sizeof(out), "%lluh %llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(out, sizeof(out), "%llum %llus", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  } else {
    std::snprintf(out, sizeof(out), "%llus", static_cast<unsigned long long>(s));
  }
  return out;
}

std::string Bytes(uint64_t n) { return kvpool::SettingsTable::FormatBytes(n); }

// "USED of CAPACITY (PCT%)" of a tier's JSON.
std::string TierUse(const nlohmann::json& tier) {
  if (!tier.is_object()) return "-";
  const uint64_t used = tier.value("used_bytes", uint64_t{0});
  const uint64_t cap = tier.value("capacity_bytes", uint64_t{0});
  char pct[32];
  std::snprintf(pct, sizeof(pct), " (%.1f%%)",
                cap ? 100.0 * static_cast<double>(used) / static_cast<double>(cap) : 0.0);
  return Bytes(used) + " of " + Bytes(cap) + pct;
}

// The node's figures as a status JSON says them, one aligned row each.
std::vector<std::pair<std::string, std::string>> StatusRows(const nlohmann::json& j) {
  std::vector<std::pair<std::string, std::string>> rows;
  const auto& d = j["dram"];
  const auto& ssd = j["ssd"];
  uint64_t hits = 0, misses = 0, conns = 0;
  if (j.contains("tenants") && j["tenants"].is_array()) {
    for (const auto& t : j["tenants"]) {
      hits += t.value("hits", uint64_t{0});
      misses += t.value("misses", uint64_t{0});
    }
  }
  conns = j.value("local_connections", uint64_t{0});
  rows.emplace_back("node", j.value("node_id", "") + " (version " + j.value("version", "") + ")");
  rows.emplace_back("uptime", Duration(j.value("uptime_s", 0.0)));
  rows.emplace_back("socket", j.value("socket_path", ""));
  rows.emplace_back("connections", std::to_string(conns));
  rows.emplace_back("dram", TierUse(d));
  rows.emplace_back("dram entries",
                    std::to_string(d.is_object() ? d.value("entries", uint64_t{0}) : 0));
  rows.emplace_back("evictions",
                    std::to_string(d.is_object() ? d.value("evictions", uint64_t{0}) : 0));
  rows.emplace_back("ssd", TierUse(ssd));
  if (ssd.is_object())
    rows.emplace_back("ssd entries", std::to_string(ssd.value("entries", uint64_t{0})));
  char ratio[64];
  std::snprintf(
      ratio, sizeof(ratio), "%llu / %llu (%.1f%% hits)", static_cast<unsigned long long>(hits),
      static_cast<unsigned long long>(misses),
      hits + misses ? 100.0 * static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0);
  rows.emplace_back("hits / misses", ratio);
  std::string members = std::to_string(j.contains("members") ? j["members"].size() : 0);
  const auto& ms = j["membership"];
  if (ms.is_object() && ms.value("fenced", false)) members += " (this node is fenced)";
  if (ms.is_object() && ms.value("etcd_outage", false)) members += " (etcd unreachable)";
  rows.emplace_back("members", members);
  // Local work is served from the start; cluster work once membership
  // admits this incarnation (a restart waits for its old lease).
  const auto& rd = j["readiness"];
  if (rd.is_object()) {
    std::string r = "local " + rd.value("local", "") + ", cluster " + rd.value("cluster", "");
    const std::string detail = rd.value("detail", "");
    if (!detail.empty()) r += " (" + detail + ")";
    rows.emplace_back("readiness", r);
  }
  rows.emplace_back("tenants", std::to_string(j.contains("tenants") ? j["tenants"].size() : 0));
  return rows;
}

void PrintRows(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t w = 0;
  for (const auto& [k, v] : rows) w = std::max(w, k.size());
  for (const auto& [k, v] : rows)
    std::printf("%-*s  %s\n", static_cast<int>(w), k.c_str(), v.c_str());
}

// stat: the node's key figures, one aligned row each.
int StatTable(const char* text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    std::fprintf(stderr, "kvpoolctl: malformed statistics from the node\n");
    return 3;
  }
  PrintRows(StatusRows(j));
  return 0;
}

// clients: one row per connected engine.
int Clients(const Admin& admin, bool json) {
  nlohmann::json j;
  if (!AdminJson(admin, "/api/v1/clients", &j, "clients") || !j["clients"].is_array()) return 3;
  if (j.contains("hidden")) {
    std::fprintf(stderr, "kvpoolctl: clients: %s (%lld connected)\n",
                 j.value("hidden", "").c_str(), static_cast<long long>(j.value("count", int64_t{0})));
    return 3;
  }
  if (json) {
    std::printf("%s\n", j["clients"].dump(2).c_str());
    return 0;
  }
  std::printf("%-8s %-12s %-28s %-12s %9s %12s %10s %10s\n", "PID", "USER", "NAME", "TENANT", "AGE",
              "OPS", "READ", "WRITTEN");
  for (const auto& c : j["clients"]) {
    std::string name = c.value("name", "");
    if (name.empty()) name = "-";
    std::printf("%-8lld %-12s %-28s %-12s %9s %12llu %10s %10s\n",
                static_cast<long long>(c.value("pid", int64_t{0})), c.value("user", "").c_str(),
                name.c_str(), c.value("tenant", "").c_str(),
                Duration(c.value("age_s", 0.0)).c_str(),
                static_cast<unsigned long long>(c.value("ops", uint64_t{0})),
                Bytes(c.value("bytes_read", uint64_t{0})).c_str(),
                Bytes(c.value("bytes_written", uint64_t{0})).c_str());
  }
  std::printf("%zu clients\n", j["clients"].size());
  return 0;
}

struct Top {
  std::chrono::milliseconds interval{1000};
  int count = 0;  // frames; 0: until interrupted
};

// The sum of a Prometheus family's samples in a /metrics text (-1: absent).
double Family(const std::string& text, const std::string& name) {
  double sum = -1;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos) continue;
    sum = (sum < 0 ? 0 : sum) + std::atof(std::string(line.substr(sp + 1)).c_str());
  }
  return sum;
}

// top: the key figures every interval, with rates over the interval.
int RunTop(const Admin& admin, const Top& top) {
  const char* counters[] = {"kvpool_ops_total",           "kvpool_hits_total",
                            "kvpool_misses_total",        "kvpool_bytes_read_total",
                            "kvpool_bytes_written_total", "kvpool_dram_evictions_total"};
  std::vector<double> prev;
  auto prev_t = std::chrono::steady_clock::now();
  const bool tty = isatty(STDOUT_FILENO);
  for (int frame = 0; top.count == 0 || frame < top.count; ++frame) {
    if (frame > 0) std::this_thread::sleep_for(top.interval);
    nlohmann::json j;
    std::string metrics;
    if (!AdminJson(admin, "/api/v1/status", &j) || !AdminGet(admin, "/metrics", &metrics)) {
      return 3;
    }
    const auto now = std::chrono::steady_clock::now();
    std::vector<double> cur;
    for (const char* c : counters) cur.push_back(Family(metrics, c));
    const double dt = std::chrono::duration<double>(now - prev_t).count();
    auto rate = [&](size_t i) {
      return prev.empty() || dt <= 0 || cur[i] < prev[i] ? -1.0 : (cur[i] - prev[i]) / dt;
    };
    auto fmt_rate = [](double r) {
      char b[32];
      if (r < 0) return std::string("-");
      std::snprintf(b, sizeof(b), "%.0f", r);
      return std::string(b);
    };
    std::vector<std::pair<std::string, std::string>> rows = StatusRows(j);
    const double hits = rate(1), misses = rate(2);
    char ratio[32] = "-";
    if (hits >= 0 && misses >= 0 && hits + misses > 0) {
      std::snprintf(ratio, sizeof(ratio), "%.1f%%", 100.0 * hits / (hits + misses));
    }
    rows.emplace_back("ops/s", fmt_rate(rate(0)));
    rows.emplace_back("hit ratio", ratio);
    rows.emplace_back("read/s", rate(3) < 0 ? "-" : Bytes(static_cast<uint64_t>(rate(3))));
    rows.emplace_back("written/s", rate(4) < 0 ? "-" : Bytes(static_cast<uint64_t>(rate(4))));
    rows.emplace_back("evictions/s", fmt_rate(rate(5)));
    if (tty) std::fputs("\033[H\033[2J", stdout);  // redraw in place
    std::printf("kvpoolctl top: %s, every %lld ms\n", admin.address.c_str(),
                static_cast<long long>(top.interval.count()));
    PrintRows(rows);
    if (!tty) std::puts("");
    std::fflush(stdout);
    prev = std::move(cur);
    prev_t = now;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path;  // empty: libkvpool's default, where the node puts it
  uint32_t timeout_ms = 5000;
  bool help = false, json = false;
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
    } else if (a == "-h" || a == "--help")
      help = true;
    else if (a == "--json" && !args.empty())
      json = true;
    else args.push_back(a);
  }
  if (help) {
    if (args.empty()) return Usage(stdout), 0;
    const Command* c = FindCommand(args[0]);
    if (c == nullptr) {
      std::fprintf(stderr, "kvpoolctl: unknown command '%s'\n", args[0].c_str());
      return Usage();
    }
    return CommandHelp(*c);
  }
  // Where no --socket names it: $KVPOOL_SOCKET, as the Python package reads
  // it, else libkvpool's default.
  if (socket_path.empty()) {
    if (const char* env = std::getenv("KVPOOL_SOCKET"); env != nullptr) socket_path = env;
  }
  if (args.empty()) return Usage();
  const std::string cmd = args[0];
  if (FindCommand(cmd) == nullptr) {
    std::fprintf(stderr, "kvpoolctl: unknown command '%s'\n", cmd.c_str());
    return Usage();
  }
  if (json && cmd != "stat" && cmd != "members" && cmd != "shards" && cmd != "tenants" &&
      cmd != "clients" && cmd != "lookup") {
    return Usage();
  }
  const bool hint =
      cmd == "retain" || cmd == "pin" || cmd == "release" || cmd == "prefetch" || cmd == "demote";
  const bool hint_ttl = cmd == "retain" || cmd == "pin";
  if (cmd == "metrics" || cmd == "members" || cmd == "shards" || cmd == "tenants" ||
      cmd == "clients" || cmd == "top" || hint) {
    Admin admin;
    std::string token_file;
    Top top;
    nlohmann::json h = {{"op", cmd}, {"keys", nlohmann::json::array()}};
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--admin" && i + 1 < args.size()) admin.address = args[++i];
      else if (hint_ttl && args[i] == "--ttl" && i + 1 < args.size()) {
        auto d = kvpool::SettingsTable::ParseDuration("ttl", args[++i]);
        if (!d.ok() || d->count() <= 0) {
          std::fprintf(stderr, "kvpoolctl: --ttl: %s\n",
                       d.ok() ? "must be above 0" : std::string(d.status().message()).c_str());
          return 2;
        }
        h["ttl_s"] = static_cast<double>(d->count()) / 1000;
      } else if (cmd == "retain" && args[i] == "--priority" && i + 1 < args.size()) {
        h["priority"] = std::atoi(args[++i].c_str());
      } else if (hint && args[i] == "--tenant" && i + 1 < args.size()) {
        h["tenant"] = args[++i];
      } else if (hint && args[i].rfind("--", 0) != 0) {
        if (!h.contains("namespace")) {
          h["namespace"] = args[i];
        } else {
          h["keys"].push_back(args[i]);
        }
      } else if (args[i].rfind("--admin=", 0) == 0)
        admin.address = args[i].substr(8);
      else if (args[i] == "--token-file" && i + 1 < args.size()) token_file = args[++i];
      else if (cmd == "top" && args[i] == "--interval" && i + 1 < args.size()) {
        auto d = kvpool::SettingsTable::ParseDuration("interval", args[++i]);
        if (!d.ok() || d->count() < 100) {
          std::fprintf(stderr, "kvpoolctl: --interval: %s\n",
                       d.ok() ? "at least 100ms" : std::string(d.status().message()).c_str());
          return 2;
        }
        top.interval = *d;
      } else if (cmd == "top" && args[i] == "--count" && i + 1 < args.size()) {
        top.count = std::atoi(args[++i].c_str());
        if (top.count < 1) return Usage();
      } else {
        return Usage();
      }
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
    if (hint) {
      if (h["keys"].empty() || (hint_ttl && !h.contains("ttl_s"))) return Usage();
      return Hint(admin, h);
    }
    if (cmd == "metrics") return Metrics(admin);
    if (cmd == "top") return RunTop(admin, top);
    if (cmd == "clients") return Clients(admin, json);
    if (json) {
      nlohmann::json j;
      if (!AdminJson(admin, cmd == "tenants" ? "/api/v1/status" : "/api/v1/members", &j)) {
        return 3;
      }
      const nlohmann::json& out = cmd == "tenants"  ? j["tenants"]
                                  : cmd == "shards" ? j["shards"]
                                                    : j;
      std::printf("%s\n", out.dump(2).c_str());
      return 0;
    }
    if (cmd == "tenants") return Tenants(admin);
    return Members(admin, cmd == "shards");
  }

  if (cmd != "put" && cmd != "get" && cmd != "exists" && cmd != "remove" && cmd != "stat" &&
      cmd != "flush" && cmd != "clear" && cmd != "lookup") {
    return Usage();
  }
  std::vector<uint64_t> hashes;
  if (cmd == "lookup") {
    if (args.size() < 2) return Usage();
    for (size_t i = 1; i < args.size(); ++i) {
      uint64_t h = 0;
      if (!ParseHash(args[i], &h)) {
        std::fprintf(stderr, "kvpoolctl: '%s' is not a 64-bit hash (decimal or 0x hex)\n",
                     args[i].c_str());
        return 2;
      }
      hashes.push_back(h);
    }
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

  if (cmd == "lookup") return Lookup(c, hashes, json);
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
      // On a terminal the prompt starts on a line of its own; into a pipe or
      // a file the bytes go exactly as stored.
      if (isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
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
    if (json) {
      std::printf("%s\n", buf.data());
      return 0;
    }
    return StatTable(buf.data());
  }
  return Usage();
}
