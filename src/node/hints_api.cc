#include "node/hints_api.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/key_id.h"
#include "common/tenant_keys.h"

namespace kvpool {

HintsApi::HintsApi(const NodeStores* stores, MetricsRegistry* metrics)
    : stores_(stores),
      metrics_(metrics),
      unknown_keys_(metrics->GetCounter("kvpool_hint_unknown_keys_total",
                                        "Keys cache hints named that were not in DRAM.")) {}

std::pair<int, std::string> HintsApi::Refuse(int code, const char* reason, const std::string& why) {
  metrics_
      ->GetCounter("kvpool_hints_refused_total", "Cache hints refused, by reason.",
                   {{"reason", reason}})
      ->Inc();
  return {code, nlohmann::json{{"error", why}}.dump()};
}

std::pair<int, std::string> HintsApi::Http(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Refuse(400, "bad_request", "the body must be a JSON object");
  const auto op = j.find("op");
  if (op == j.end() || !op->is_string() || (*op != "retain" && *op != "pin" && *op != "release")) {
    return Refuse(400, "bad_request", "op must be \"retain\", \"pin\" or \"release\"");
  }
  const auto ns = j.find("namespace");
  const auto keys = j.find("keys");
  if (ns == j.end() || !ns->is_string() || keys == j.end() || !keys->is_array()) {
    return Refuse(400, "bad_request", "namespace (a string) and keys (an array) are required");
  }
  std::vector<KeyId> ids;
  ids.reserve(keys->size());
  for (const auto& k : *keys) {
    if (!k.is_string()) return Refuse(400, "bad_request", "each key must be a string");
    ids.push_back(MakeKeyId(ns->get<std::string>(), k.get<std::string>()));
  }
  std::chrono::nanoseconds ttl{0};
  if (*op != "release") {
    const auto t = j.find("ttl_s");
    if (t == j.end() || !t->is_number() || !std::isfinite(t->get<double>()) ||
        t->get<double>() <= 0 || t->get<double>() > 1e7) {
      return Refuse(400, "bad_ttl", "ttl_s must be a number of seconds above 0");
    }
    ttl = std::chrono::nanoseconds(static_cast<int64_t>(std::llround(t->get<double>() * 1e9)));
  }
  uint8_t priority = 0;
  if (const auto p = j.find("priority"); p != j.end()) {
    if (!p->is_number_integer() || p->get<int64_t>() < 0 || p->get<int64_t>() > 255) {
      return Refuse(400, "bad_request", "priority must be an integer in 0..255");
    }
    priority = static_cast<uint8_t>(p->get<int64_t>());
  }
  TieredStore* store = stores_->store();
  if (const auto t = j.find("tenant"); t != j.end()) {
    if (!t->is_string()) return Refuse(400, "bad_request", "tenant must be a string");
    if (*t != kDefaultTenant) {
      store = nullptr;
      for (const TenantStore& ts : stores_->tenants()) {
        if (ts.spec.name == *t) store = ts.store.get();
      }
      if (store == nullptr) return Refuse(404, "unknown_tenant", "no tenant " + t->dump());
      // A tenant's entries are kept under its own ids (common/tenant_keys.h).
      const TenantKeys bind(t->get<std::string>());
      for (KeyId& id : ids) id = bind.Bind(id);
    }
  }
  Result<HintResult> r = *op == "retain" ? store->Retain(ids, ttl, priority)
                         : *op == "pin"  ? store->PinFor(ids, ttl)
                                         : Result<HintResult>(store->ReleaseLeases(ids));
  if (!r.ok()) {
    const bool budget = r.status().code() == StatusCode::kResourceExhausted;
    const bool ttl_bad = r.status().message().find("ttl") != std::string::npos;
    return Refuse(budget ? 429 : 400,
                  budget    ? "pin_budget"
                  : ttl_bad ? "bad_ttl"
                            : "too_many_keys",
                  std::string(r.status().message()));
  }
  metrics_
      ->GetCounter("kvpool_hints_total", "Cache hints applied, by operation.",
                   {{"op", op->get<std::string>()}})
      ->Inc();
  unknown_keys_->Inc(r->unknown);
  return {200,
          nlohmann::json{{"applied", r->applied}, {"unknown", r->unknown}, {"clipped", r->clipped}}
              .dump()};
}

}  // namespace kvpool
