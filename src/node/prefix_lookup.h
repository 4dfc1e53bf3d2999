// The prefix lookup's JSON faces (admin POST /api/v1/lookup, the local
// protocol's LookupPrefix answer): reading a router's request and writing
// the answer (docs/kv-events.md, "Prefix lookups").
//
// Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blocks/prefix.h"
#include "common/status.h"

namespace kvpool {

struct PrefixRequest {
  std::vector<uint64_t> hashes;
  std::optional<std::chrono::milliseconds> timeout;
  // "local": true -- this node's own blocks only (what it holds, from its
  // descriptors; no index asked): for checking the index against its holders.
  bool local = false;
};

// Reads {"hashes": [h, ...], "timeout_ms": N, "local": false}. A hash is a JSON integer
// (unsigned 64-bit, or negative: its two's complement, as signed int64
// hashes are written), or a string: decimal, or "0x" and hex digits (a
// bytes hash written as hex: its last 16 digits, as EngineHash64 reads
// bytes). InvalidArgument with the reason: not JSON, no hashes, a hash
// that is none of these, more than max_hashes, a timeout outside 1..10000.
Result<PrefixRequest> ParsePrefixRequest(const std::string& body, uint32_t max_hashes);

// {"blocks": n, "longest": k, "holders": [{"node", "address", "blocks",
//  "dram", "ssd", "tiers": "DDS..."}], "homes": h, "homes_failed": f}
// tiers: per leading block held, D (in DRAM) or S (on SSD only).
std::string PrefixAnswerJson(const blocks::PrefixAnswer& answer);

}  // namespace kvpool
