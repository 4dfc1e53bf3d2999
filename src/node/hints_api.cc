#include "node/hints_api.h"

#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/key_id.h"
#include "common/tenant_keys.h"

namespace kvpool {

namespace {
Counter* UnknownKeys(MetricsRegistry* metrics) {
  return metrics->GetCounter(
      "kvpool_hint_unknown_keys_total",
      "Keys cache hints named that were not in DRAM (prefetch: in neither tier).");
}
}  // namespace

void CountHintRefused(MetricsRegistry* metrics, const char* reason) {
  metrics
      ->GetCounter("kvpool_hints_refused_total", "Cache hints refused, by reason.",
                   {{"reason", reason}})
      ->Inc();
}

const char* CountHint(MetricsRegistry* metrics, const std::string& tenant, HintOp op,
                      const Result<HintResult>& r) {
  if (!r.ok()) {
    const char* reason = r.status().code() == StatusCode::kResourceExhausted     ? "pin_budget"
                         : r.status().message().find("ttl") != std::string::npos ? "bad_ttl"
                                                                                 : "too_many_keys";
    CountHintRefused(metrics, reason);
    metrics
        ->GetCounter("kvpool_tenant_hints_refused_total",
                     "Cache hints refused, by reason, per tenant.",
                     {{"tenant", tenant}, {"reason", reason}})
        ->Inc();
    return reason;
  }
  metrics
      ->GetCounter("kvpool_hints_total", "Cache hints applied, by operation.",
                   {{"op", HintOpName(op)}})
      ->Inc();
  metrics
      ->GetCounter("kvpool_tenant_hints_total", "Cache hints applied, by operation, per tenant.",
                   {{"tenant", tenant}, {"op", HintOpName(op)}})
      ->Inc();
  UnknownKeys(metrics)->Inc(r->unknown);
  return nullptr;
}

namespace {
// The keys of `keys` the store holds in neither tier.
std::vector<KeyId> HeldNowhere(TieredStore* store, const std::vector<KeyId>& keys) {
  std::vector<KeyId> out;
  for (const KeyId& k : keys) {
    if (!store->Contains(k)) out.push_back(k);
  }
  return out;
}
}  // namespace

void RunHint(TieredStore* store, RemoteReads* reads, HintOp op, std::vector<KeyId> keys,
             std::chrono::nanoseconds ttl, uint8_t priority, HintDone done) {
  auto shared_keys = std::make_shared<std::vector<KeyId>>(std::move(keys));
  if (op == HintOp::kPrefetch) {
    store->Prefetch(*shared_keys,
                    [store, reads, shared_keys, done = std::move(done)](Result<HintResult> r) {
                      if (!r.ok() || reads == nullptr || r->unknown == 0) return done(std::move(r));
                      HintResult here = *r;
                      reads->Prefetch(HeldNowhere(store, *shared_keys),
                                      [store, here, done](std::vector<KeyId> fetched) mutable {
                                        const uint64_t n = store->MarkPrefetched(fetched);
                                        here.applied += n;
                                        here.moved += n;
                                        here.unknown -= std::min(here.unknown, n);
                                        done(here);
                                      });
                    });
    return;
  }
  Result<HintResult> r = store->Hint(op, *shared_keys, ttl, priority);
  if (!r.ok() || reads == nullptr || r->unknown == 0) return done(std::move(r));
  std::vector<KeyId> elsewhere = HeldNowhere(store, *shared_keys);
  if (elsewhere.empty()) return done(std::move(r));
  const HintResult here = *r;
  const uint64_t sent = elsewhere.size();
  RemoteReads::HintSpec spec;
  spec.op = op;
  spec.ttl_ms = static_cast<uint64_t>(  // a part of a millisecond rounds up
      std::chrono::ceil<std::chrono::milliseconds>(ttl).count());
  spec.priority = priority;
  reads->Hint(spec, std::move(elsewhere),
              [here, sent, done = std::move(done)](Result<HintResult> there) {
                if (!there.ok()) return done(std::move(there));
                HintResult m = here;
                m.unknown = here.unknown - std::min(here.unknown, sent) + there->unknown;
                m.applied += there->applied;
                m.clipped += there->clipped;
                m.moved += there->moved;
                done(m);
              });
}

HintsApi::HintsApi(const NodeStores* stores, ReadsOf reads_of, MetricsRegistry* metrics)
    : stores_(stores), reads_of_(std::move(reads_of)), metrics_(metrics) {
  UnknownKeys(metrics);  // on /metrics from the start
}

std::pair<int, std::string> HintsApi::Refuse(int code, const char* reason, const std::string& why) {
  CountHintRefused(metrics_, reason);
  return {code, nlohmann::json{{"error", why}}.dump()};
}

std::pair<int, std::string> HintsApi::Http(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Refuse(400, "bad_request", "the body must be a JSON object");
  const auto op_field = j.find("op");
  HintOp op{};
  bool known = false;
  if (op_field != j.end() && op_field->is_string()) {
    for (HintOp o :
         {HintOp::kRetain, HintOp::kPin, HintOp::kPrefetch, HintOp::kDemote, HintOp::kRelease}) {
      if (*op_field == HintOpName(o)) {
        op = o;
        known = true;
      }
    }
  }
  if (!known) {
    return Refuse(400, "bad_request",
                  "op must be \"retain\", \"pin\", \"prefetch\", \"demote\" or \"release\"");
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
  if (op == HintOp::kRetain || op == HintOp::kPin) {
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
  RemoteReads* reads = reads_of_ ? reads_of_(-1) : nullptr;
  std::string tenant = kDefaultTenant;
  if (const auto t = j.find("tenant"); t != j.end()) {
    if (!t->is_string()) return Refuse(400, "bad_request", "tenant must be a string");
    if (*t != kDefaultTenant) {
      store = nullptr;
      const auto& tenants = stores_->tenants();
      for (size_t i = 0; i < tenants.size(); ++i) {
        if (tenants[i].spec.name != *t) continue;
        store = tenants[i].store.get();
        tenant = tenants[i].spec.name;
        reads = reads_of_ ? reads_of_(static_cast<int>(i)) : nullptr;
      }
      if (store == nullptr) return Refuse(404, "unknown_tenant", "no tenant " + t->dump());
      // A tenant's entries are kept under its own ids (common/tenant_keys.h).
      const TenantKeys bind(t->get<std::string>());
      for (KeyId& id : ids) id = bind.Bind(id);
    }
  }
  // The holders' part and the promotions are waited for (bounded by the
  // cluster's call deadlines and the SSD reads).
  auto answer = std::make_shared<std::promise<Result<HintResult>>>();
  auto waited = answer->get_future();
  RunHint(store, reads, op, std::move(ids), ttl, priority,
          [answer](Result<HintResult> r) { answer->set_value(std::move(r)); });
  const Result<HintResult> r = waited.get();
  if (const char* reason = CountHint(metrics_, tenant, op, r); reason != nullptr) {
    return {r.status().code() == StatusCode::kResourceExhausted ? 429 : 400,
            nlohmann::json{{"error", std::string(r.status().message())}}.dump()};
  }
  return {200, nlohmann::json{{"applied", r->applied},
                              {"unknown", r->unknown},
                              {"clipped", r->clipped},
                              {"moved", r->moved}}
                   .dump()};
}

}  // namespace kvpool
