// RemoteSource: what the local server asks of the cluster. Reads of keys
// missing here go to their holders (via the keys' home nodes). (What this
// node stores and drops reaches the homes through the store's holdings
// stream, not through this interface.)
//
// Thread-safe. The done callbacks run exactly once, on some cluster thread
// (never inside the call), no later than the source's call deadlines.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/key_id.h"
#include "store/tiered_store.h"

namespace kvpool {

class RemoteSource {
 public:
  virtual ~RemoteSource() = default;

  // Fetches keys this node does not hold into local DRAM (kept as local
  // replicas); done gets a pin per key found (any order; misses are absent).
  using FetchDone = std::function<void(std::vector<TieredStore::Pin>)>;
  virtual void Fetch(std::vector<KeyId> keys, FetchDone done) = 0;
  // Which of the keys some live peer holds.
  using ExistsDone = std::function<void(std::vector<KeyId>)>;
  virtual void Exists(std::vector<KeyId> keys, ExistsDone done) = 0;
};

}  // namespace kvpool
