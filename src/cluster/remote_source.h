// What the local server asks of the cluster, in two faces:
// - RemoteReads: reads of keys missing here, from their holders (via the
//   keys' home nodes); RemoteReader (remote_reader.h) is the cluster's.
// - RemotePlacement: where this node's writes go and when the homes hear
//   of them; ClusterPlacement (cluster_placement.h) is the cluster's.
// (What this node stores and drops reaches the homes through the store's
// holdings stream, not through these; PublishNow only asks that it be sent
// at once.) A standalone node has neither.
//
// Thread-safe. The done callbacks run exactly once, on some cluster thread
// (never inside the call), no later than the source's call deadlines.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/key_id.h"
#include "store/tiered_store.h"

namespace kvpool {

class RemoteReads {
 public:
  virtual ~RemoteReads() = default;

  // Fetches keys this node does not hold into local DRAM (kept as local
  // replicas); done gets a pin per key found (any order; misses are absent).
  using FetchDone = std::function<void(std::vector<TieredStore::Pin>)>;
  virtual void Fetch(std::vector<KeyId> keys, FetchDone done) = 0;
  // Which of the keys some live peer holds.
  using ExistsDone = std::function<void(std::vector<KeyId>)>;
  virtual void Exists(std::vector<KeyId> keys, ExistsDone done) = 0;
  // Whether a lookup lately found key recently dropped by the node that
  // held it (its home's ghost), or a fetch found it gone from the holder a
  // lookup named: a write of it is a block coming back.
  virtual bool EvictedLately(const KeyId& key) const = 0;

  // Cache hints (docs/hints.md) for keys this node holds in neither tier:
  // each key's hint goes to a live holder its home names (a peer hint, to
  // each holder its keys at once); done gets the holders' counts summed,
  // and every key no holder took (none known, or its holder unreachable)
  // counted unknown. A holder's refusal (its pin budget, a bad TTL) is the
  // answer, though other holders may have applied their part. Not
  // prefetch (Prefetch). A source that cannot send hints (this default)
  // counts every key unknown, calling done inside the call.
  struct HintSpec {
    HintOp op = HintOp::kRetain;
    uint64_t ttl_ms = 0;
    uint8_t priority = 0;
  };
  using HintDone = std::function<void(Result<HintResult>)>;
  virtual void Hint(const HintSpec& spec, std::vector<KeyId> keys, HintDone done) {
    (void)spec;
    HintResult r;
    r.unknown = keys.size();
    done(r);
  }
  // Prefetch of keys this node holds in neither tier: fetches each from a
  // live holder into local DRAM and keeps it here, placed as a write (not
  // first in line, whatever --read-replicas says); done gets the keys now
  // here. This default fetches none, calling done inside the call.
  using PrefetchDone = std::function<void(std::vector<KeyId> here)>;
  virtual void Prefetch(std::vector<KeyId> keys, PrefetchDone done) {
    (void)keys;
    done({});
  }
};

class RemotePlacement {
 public:
  virtual ~RemotePlacement() = default;

  // The keys about to be written here continue, in order, a prefix chain
  // right after `before` (null: they start a chain); the writer's
  // hit-prefix call saw the chain. A placement that keeps chains together
  // sends them where `before` is. Quick; no callback.
  virtual void NoteChain(const KeyId* before, std::span<const KeyId> keys) = 0;
  // A put of a noted key whose value goes to another node may be sent there
  // straight from the caller's bytes, without a slot here: true when it was
  // (the value is then readable once that node has it; if it cannot take
  // it, it is stored here). False: store it here as usual.
  virtual bool Forward(const KeyId& key, std::span<const uint8_t> value) = 0;
  // Whether a value of key would now go to another node (Forward may still
  // refuse it later, when the bytes in flight are at their budget).
  virtual bool WouldForward(const KeyId& key) const = 0;
  // Puts stored values here: what this node queued for the keys' homes is
  // sent now, before the puts are answered (when another flush is running
  // or much is queued, soon after, from another thread), so a request that
  // another node gets right after them (a conversation's next turn) mostly
  // finds them. Quick, never waits; no callback. The local server calls it
  // at most once per read of a client's frames (LocalOps::PublishStored).
  virtual void PublishNow() = 0;
};

// One tenant's cluster as the local server sees it: both set in a cluster,
// both null on a standalone node. Not owned.
struct ClusterFaces {
  RemoteReads* reads = nullptr;
  RemotePlacement* placement = nullptr;
};

}  // namespace kvpool
