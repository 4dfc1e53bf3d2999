// HintsApi: cache hints over the admin endpoint (POST /api/v1/hints), for
// routers and orchestrators that know what comes back: retain a paused
// session's prefix for the length of a tool call, pin a shared prompt,
// prefetch a session about to resume, demote or release a finished branch
// (docs/hints.md). Engines send the same hints through the client
// (kvpool_hint; LocalOps), which counts them with CountHint below.
//
// The body is one JSON object:
//   {"op": "retain" | "pin" | "prefetch" | "demote" | "release",
//    "namespace": NS, "keys": [NAME, ...]   (key ids as kvpool_key_ids makes them)
//    "ttl_s": SECONDS                        (retain and pin; up to --hint-max-ttl)
//    "priority": 0..255                      (retain; higher is kept longer; default 0)
//    "tenant": NAME}                         (default: the default tenant)
// and the answer {"applied": N, "unknown": M, "clipped": C, "moved": V}:
// keys in DRAM the hint applied to (prefetch: keys in DRAM once it ended),
// keys it did not find there (prefetch: in neither tier; counted, not an
// error), retentions it clipped, and keys it moved between tiers (demote:
// to SSD; prefetch: into DRAM, answered once they are there).
// 400 for a bad body, a TTL of 0 or past the maximum, or more keys than
// DramOptions::hint_max_keys; 404 for an unknown tenant; 429 for pins past
// the tenant's pin budget. On an error nothing changes.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/remote_source.h"
#include "common/metrics.h"
#include "node/node_stores.h"

namespace kvpool {

// Counts a hint's outcome on /metrics: kvpool_hints_total{op},
// kvpool_tenant_hints_total{tenant,op} and kvpool_hint_unknown_keys_total
// when it applied, else kvpool_hints_refused_total{reason} and
// kvpool_tenant_hints_refused_total{tenant,reason}. Returns the reason of a
// refusal ("pin_budget", "bad_ttl", "too_many_keys"), nullptr when it
// applied.
const char* CountHint(MetricsRegistry* metrics, const std::string& tenant, HintOp op,
                      const Result<HintResult>& r);

// One hint on one tenant's store and, for the keys it holds in neither
// tier, at their holders in the cluster (reads; null on a standalone node):
// RemoteReads::Hint, or for a prefetch RemoteReads::Prefetch, whose keys
// are then marked prefetched here. done gets the counts merged (a key
// counted once: applied here or at its holder, or unknown), once, maybe on
// another thread or inside the call. ttl and priority: retain and pin.
using HintDone = std::function<void(Result<HintResult>)>;
void RunHint(TieredStore* store, RemoteReads* reads, HintOp op, std::vector<KeyId> keys,
             std::chrono::nanoseconds ttl, uint8_t priority, HintDone done);
// Counts a hint refused before it reached a store (a bad request).
void CountHintRefused(MetricsRegistry* metrics, const char* reason);

class HintsApi {
 public:
  // The cluster face of the default tenant (-1) or of stores->tenants()[i]
  // (null: none, a standalone node).
  using ReadsOf = std::function<RemoteReads*(int tenant)>;
  // stores and metrics must outlive this object.
  HintsApi(const NodeStores* stores, ReadsOf reads_of, MetricsRegistry* metrics);
  std::pair<int, std::string> Http(const std::string& body);

 private:
  std::pair<int, std::string> Refuse(int code, const char* reason, const std::string& why);

  const NodeStores* const stores_;
  const ReadsOf reads_of_;
  MetricsRegistry* const metrics_;
};

}  // namespace kvpool
