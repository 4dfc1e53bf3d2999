#include "node/tenants.h"

#include <fmt/format.h>
#include <grp.h>
#include <pwd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>

#include "common/secret_file.h"
#include "common/settings.h"

namespace kvpool {
namespace {

constexpr size_t kMaxTenantsFile = 1u << 20;
constexpr size_t kMaxTenantName = 32;

bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > kMaxTenantName || n == kDefaultTenant) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(sep, b);
    if (e == std::string_view::npos) e = s.size();
    out.emplace_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// A number, or a user (group) name looked up in the system's databases.
bool ParseId(const std::string& text, bool group, uint32_t* out) {
  if (text.empty()) return false;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (ec == std::errc() && p == text.data() + text.size()) return true;
  std::vector<char> buf(16384);
  if (group) {
    struct group g {}, *res = nullptr;
    if (getgrnam_r(text.c_str(), &g, buf.data(), buf.size(), &res) != 0 || res == nullptr) {
      return false;
    }
    *out = res->gr_gid;
  } else {
    struct passwd pw {}, *res = nullptr;
    if (getpwnam_r(text.c_str(), &pw, buf.data(), buf.size(), &res) != 0 || res == nullptr) {
      return false;
    }
    *out = res->pw_uid;
  }
  return true;
}

}  // namespace

Result<std::vector<TenantSpec>> ParseTenants(std::string_view text, std::string_view where) {
  std::vector<TenantSpec> out;
  std::map<uint32_t, std::string> uid_owner, gid_owner;
  std::map<std::string, std::string> token_owner;
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.empty()) continue;
    auto bad = [&](const std::string& why) {
      return InvalidArgument(fmt::format("{} line {}: {}", where, lineno, why));
    };
    if (w[0] != "tenant" || w.size() < 2) {
      return bad(
          "expected 'tenant NAME dram=SIZE [ssd=SIZE] [pins=SIZE] [uids=...] [gids=...] "
          "[tokens=...]'");
    }
    TenantSpec t;
    t.name = w[1];
    if (!ValidName(t.name)) {
      return bad(fmt::format("tenant name '{}' must be 1-{} of a-z, 0-9, _ and - (and not '{}')",
                             t.name, kMaxTenantName, kDefaultTenant));
    }
    for (const auto& o : out) {
      if (o.name == t.name) return bad(fmt::format("tenant '{}' is defined twice", t.name));
    }
    bool have_dram = false;
    for (size_t i = 2; i < w.size(); ++i) {
      size_t eq = w[i].find('=');
      std::string key = w[i].substr(0, eq);
      std::string val = eq == std::string::npos ? "" : w[i].substr(eq + 1);
      if (eq == std::string::npos || val.empty()) {
        return bad(fmt::format("'{}' has no value", w[i]));
      }
      if (key == "dram" || key == "ssd" || key == "pins") {
        uint64_t v = 0;
        if (!SettingsTable::ParseBytes(val, &v)) return bad(fmt::format("bad size '{}'", val));
        if (key == "pins") {
          t.pin_bytes = v;
        } else {
          (key == "dram" ? t.dram_bytes : t.ssd_bytes) = v;
        }
        have_dram |= key == "dram";
      } else if (key == "uids" || key == "gids") {
        bool group = key == "gids";
        for (const auto& item : Split(val, ',')) {
          uint32_t id = 0;
          if (!ParseId(item, group, &id)) {
            return bad(fmt::format("unknown {} '{}'", group ? "group" : "user", item));
          }
          auto& owner = group ? gid_owner : uid_owner;
          auto [it, fresh] = owner.emplace(id, t.name);
          if (!fresh) {
            return bad(fmt::format("{} {} already belongs to tenant '{}'", group ? "gid" : "uid",
                                   id, it->second));
          }
          (group ? t.gids : t.uids).push_back(id);
        }
      } else if (key == "tokens") {
        for (const auto& item : Split(val, ',')) {
          if (item.empty()) return bad("an empty token name");
          auto [it, fresh] = token_owner.emplace(item, t.name);
          if (!fresh) {
            return bad(fmt::format("token '{}' already belongs to tenant '{}'", item, it->second));
          }
          t.tokens.push_back(item);
        }
      } else {
        return bad(fmt::format("unknown setting '{}' (dram, ssd, pins, uids, gids, tokens)", key));
      }
    }
    if (!have_dram || t.dram_bytes == 0) {
      return bad(fmt::format("tenant '{}' needs a DRAM quota (dram=SIZE)", t.name));
    }
    if (t.uids.empty() && t.gids.empty() && t.tokens.empty()) {
      return bad(fmt::format(
          "tenant '{}' lists no uids, gids or tokens: no client would belong to it", t.name));
    }
    out.push_back(std::move(t));
  }
  return out;
}

Result<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path) {
  KVPOOL_ASSIGN_OR_RETURN(std::string text, ReadTrustedFile(path, "tenants file", kMaxTenantsFile));
  return ParseTenants(text, fmt::format("tenants file {}", path));
}

int TenantOfCredentials(const std::vector<TenantSpec>& tenants, uint32_t uid,
                        const std::vector<uint32_t>& gids) {
  for (size_t i = 0; i < tenants.size(); ++i) {
    const auto& u = tenants[i].uids;
    if (std::find(u.begin(), u.end(), uid) != u.end()) return static_cast<int>(i);
  }
  for (size_t i = 0; i < tenants.size(); ++i) {
    for (uint32_t g : gids) {
      const auto& tg = tenants[i].gids;
      if (std::find(tg.begin(), tg.end(), g) != tg.end()) return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace kvpool
