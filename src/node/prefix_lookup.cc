#include "node/prefix_lookup.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace kvpool {
namespace {

// A hash written as a string: decimal, or 0x and hex (its last 16 digits).
bool ParseHashString(const std::string& s, uint64_t* out) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    if (s.size() > 2 + 64) return false;
    uint64_t v = 0;
    for (size_t i = 2; i < s.size(); ++i) {
      const char c = s[i];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return false;
      v = (v << 4) | static_cast<uint64_t>(d);
    }
    *out = v;
    return true;
  }
  if (s.empty() || s.size() > 20) return false;
  unsigned __int128 v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (v > UINT64_MAX) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

}  // namespace

Result<PrefixRequest> ParsePrefixRequest(const std::string& body, uint32_t max_hashes) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("the body must be a JSON object: {\"hashes\": [...]}");
  }
  auto h = j.find("hashes");
  if (h == j.end() || !h->is_array()) {
    return InvalidArgument("\"hashes\" must be an array of the request's engine block hashes");
  }
  if (h->size() > max_hashes) {
    return InvalidArgument(
        fmt::format("{} hashes: a lookup carries at most {}", h->size(), max_hashes));
  }
  PrefixRequest r;
  r.hashes.reserve(h->size());
  for (size_t i = 0; i < h->size(); ++i) {
    const nlohmann::json& x = (*h)[i];
    uint64_t v = 0;
    if (x.is_number_unsigned()) {
      v = x.get<uint64_t>();
    } else if (x.is_number_integer()) {
      v = static_cast<uint64_t>(x.get<int64_t>());
    } else if (!x.is_string() || !ParseHashString(x.get<std::string>(), &v)) {
      return InvalidArgument(fmt::format(
          "hashes[{}] is not a 64-bit integer, a decimal string or a 0x hex string", i));
    }
    r.hashes.push_back(v);
  }
  if (auto l = j.find("local"); l != j.end()) {
    if (!l->is_boolean()) return InvalidArgument("\"local\" must be true or false");
    r.local = l->get<bool>();
  }
  if (auto t = j.find("timeout_ms"); t != j.end()) {
    if (!t->is_number_integer() || t->get<int64_t>() < 1 || t->get<int64_t>() > 10000) {
      return InvalidArgument("\"timeout_ms\" must be an integer from 1 to 10000");
    }
    r.timeout = std::chrono::milliseconds(t->get<int64_t>());
  }
  return r;
}

std::string PrefixAnswerJson(const blocks::PrefixAnswer& a) {
  nlohmann::json holders = nlohmann::json::array();
  for (const auto& h : a.holders) {
    std::string tiers;
    for (uint8_t t : h.tiers) tiers.push_back((t & blocks::kTierDram) != 0 ? 'D' : 'S');
    holders.push_back({{"node", h.node_id},
                       {"address", h.address},
                       {"blocks", h.blocks},
                       {"dram", h.dram},
                       {"ssd", h.ssd},
                       {"tiers", tiers}});
  }
  nlohmann::json j = {{"blocks", a.asked},
                      {"longest", a.longest},
                      {"holders", holders},
                      {"homes", a.homes},
                      {"homes_failed", a.homes_failed}};
  return j.dump();
}

}  // namespace kvpool
