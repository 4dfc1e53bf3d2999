#include "node/prefix_lookup.h"

#include <fmt/format.h>

#include <algorithm>
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

PrefixLookups::PrefixLookups(std::string node_id, const cluster::BlockIndexOptions& options,
                             std::chrono::milliseconds default_timeout,
                             blocks::DescriptorTable* descriptors, MetricsRegistry* metrics)
    : node_id_(std::move(node_id)),
      max_hashes_(options.max_hashes),
      default_timeout_(default_timeout),
      descriptors_(descriptors),
      refused_(metrics->GetCounter(
          "kvpool_lookup_refused_total",
          "Prefix lookups refused (a malformed body, too many hashes), answered 400")) {}

PrefixLookups::~PrefixLookups() { Stop(); }

void PrefixLookups::set_index(cluster::BlockIndex* index, std::string address) {
  address_ = std::move(address);
  index_.store(index);
}

Result<blocks::PrefixAnswer> PrefixLookups::Lookup(std::span<const uint64_t> hashes,
                                                   std::chrono::milliseconds timeout) const {
  if (cluster::BlockIndex* index = index_.load()) return index->Lookup(hashes, timeout);
  return Local(hashes);
}

Result<blocks::PrefixAnswer> PrefixLookups::Local(std::span<const uint64_t> hashes) const {
  if (hashes.size() > max_hashes_) {
    return InvalidArgument(fmt::format("a prefix lookup carries at most {} hashes, not {}",
                                       max_hashes_, hashes.size()));
  }
  std::vector<uint8_t> tiers(hashes.size());
  descriptors_->Tiers(hashes, tiers.data());
  blocks::PrefixHolder self;
  self.node_id = node_id_;
  if (index_.load() != nullptr) self.address = address_;
  std::vector<std::pair<blocks::PrefixHolder, std::vector<uint8_t>>> nodes;
  nodes.emplace_back(std::move(self), std::move(tiers));
  return blocks::BuildPrefixAnswer(static_cast<uint32_t>(hashes.size()), std::move(nodes));
}

std::pair<int, std::string> PrefixLookups::Http(const std::string& body) const {
  auto error = [](int code, const Status& s) {
    return std::make_pair(code, nlohmann::json{{"error", s.message()}}.dump());
  };
  auto req = ParsePrefixRequest(body, max_hashes_);
  if (!req.ok()) {
    refused_->Inc();
    return error(400, req.status());
  }
  auto a = req->local ? Local(req->hashes)
                      : Lookup(req->hashes, req->timeout.value_or(default_timeout_));
  if (!a.ok()) {
    const bool bad = a.status().code() == StatusCode::kInvalidArgument;
    if (bad) refused_->Inc();
    return error(bad ? 400 : 503, a.status());
  }
  return {200, PrefixAnswerJson(*a)};
}

void PrefixLookups::Start(std::vector<uint64_t> hashes, uint32_t timeout_ms,
                          std::function<void(Status, std::string)> done) {
  pool_.Submit([this, hashes = std::move(hashes), timeout_ms, done = std::move(done)] {
    auto timeout = timeout_ms == 0 ? default_timeout_
                                   : std::chrono::milliseconds(std::min(timeout_ms, 10000u));
    auto a = Lookup(hashes, timeout);
    if (!a.ok()) return done(a.status(), "");
    done(Status::Ok(), PrefixAnswerJson(*a));
  });
}

void PrefixLookups::Stop() { pool_.Stop(); }

}  // namespace kvpool
