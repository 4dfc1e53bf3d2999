// A router's prefix lookup on this node (docs/kv-events.md, "Prefix
// lookups"): its JSON faces (admin POST /api/v1/lookup, the local
// protocol's LookupPrefix answer), pure functions; and PrefixLookups, which
// answers from the cluster's block index or this node's own descriptors.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "blocks/descriptor_table.h"
#include "blocks/prefix.h"
#include "cluster/block_index.h"
#include "common/executor.h"
#include "common/metrics.h"
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

// The lookups themselves. Thread-safe; set_index before the calls that use
// it (the cluster opens after the local faces exist).
class PrefixLookups {
 public:
  // descriptors: this node's blocks; metrics counts refusals. Both must
  // outlive the object.
  PrefixLookups(std::string node_id, const cluster::BlockIndexOptions& options,
                std::chrono::milliseconds default_timeout, blocks::DescriptorTable* descriptors,
                MetricsRegistry* metrics);
  ~PrefixLookups();
  // In a cluster: its block index (must outlive the lookups; null: none)
  // and this node's peer address.
  void set_index(cluster::BlockIndex* index, std::string address);

  // The cluster's block index, or this node's own descriptors when
  // standalone. Blocks up to the timeout.
  Result<blocks::PrefixAnswer> Lookup(std::span<const uint64_t> hashes,
                                      std::chrono::milliseconds timeout) const;
  // What this node itself holds of the blocks (its descriptors).
  Result<blocks::PrefixAnswer> Local(std::span<const uint64_t> hashes) const;
  // Admin POST /api/v1/lookup: the HTTP code and the JSON body (400 for a
  // malformed request or too many hashes, counted; 503 when the index
  // could not answer).
  std::pair<int, std::string> Http(const std::string& body) const;
  // A local client's lookup (LocalServerOptions::lookup_prefix): run on a
  // thread of its own, as it waits on the cluster; timeout_ms 0: the
  // default, else at most 10 s. done(status, answer JSON).
  void Start(std::vector<uint64_t> hashes, uint32_t timeout_ms,
             std::function<void(Status, std::string)> done);
  // Stops the lookups' thread; the queued ones return at once.
  void Stop();

 private:
  const std::string node_id_;
  const uint32_t max_hashes_;
  const std::chrono::milliseconds default_timeout_;
  blocks::DescriptorTable* const descriptors_;
  Counter* const refused_;
  std::atomic<cluster::BlockIndex*> index_{nullptr};
  std::string address_;  // set with index_, before it
  ThreadPool pool_{1, "kvpool-lookup"};
};

}  // namespace kvpool
