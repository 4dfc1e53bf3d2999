// HintsApi: cache hints over the admin endpoint (POST /api/v1/hints), for
// routers and orchestrators that know what comes back: retain a paused
// session's prefix for the length of a tool call, pin a shared prompt,
// release a finished branch (docs/hints.md).
//
// The body is one JSON object:
//   {"op": "retain" | "pin" | "release",
//    "namespace": NS, "keys": [NAME, ...]   (key ids as kvpool_key_ids makes them)
//    "ttl_s": SECONDS                        (retain and pin; up to --hint-max-ttl)
//    "priority": 0..255                      (retain; higher is kept longer; default 0)
//    "tenant": NAME}                         (default: the default tenant)
// and the answer {"applied": N, "unknown": M}: keys in DRAM the hint
// applied to, and keys it did not find there (counted, not an error).
// 400 for a bad body, a TTL of 0 or past the maximum, or more keys than
// DramOptions::hint_max_keys; 404 for an unknown tenant; 429 for pins past
// the tenant's --pin-max-bytes. On an error nothing changes.
#pragma once

#include <string>
#include <utility>

#include "common/metrics.h"
#include "node/node_stores.h"

namespace kvpool {

class HintsApi {
 public:
  // stores and metrics must outlive this object.
  HintsApi(const NodeStores* stores, MetricsRegistry* metrics);
  std::pair<int, std::string> Http(const std::string& body);

 private:
  std::pair<int, std::string> Refuse(int code, const char* reason, const std::string& why);

  const NodeStores* const stores_;
  MetricsRegistry* const metrics_;
  Counter* unknown_keys_;
};

}  // namespace kvpool
