// Directory: the home node's soft-state map key id -> the nodes (with
// incarnation) that hold the key, fed by holders' Publish batches.
//
// Bounded: at most max_entries keys (new keys beyond it are not recorded:
// a lookup of them misses, which is safe). A key lists at most
// kDirectoryHoldersPerKey holders (the newest; lookups return these); the
// older ones are kept as spares (promoted when a listed holder leaves), up
// to max_entries spares in all, so the directory knows exactly which keys
// each holder claims. Entries of dead incarnations are dropped by Prune()
// when the membership view changes.
// Stored as a flat open-addressing table of 32-byte slots (holders are
// 16-bit indexes into an interned (node, incarnation) table), at most 80%
// full: 40-80 bytes per key. The slot of a key is found from the top bits
// of its id, so a shard's keys sit in one run of the table and are listed
// without a full scan. Memory is reported (kvpool_directory_entries,
// kvpool_directory_bytes, and kvpool_directory_ghost_bytes for the ghost).
//
// Anti-entropy: per (holder, shard) the directory keeps the count and the
// sum of ShardDigestOf() of the keys the holder claims, updated with every
// change, so comparing a holder's digest costs nothing per key.
//
// Thread-safe (one mutex; no call leaves the process).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "membership/membership.h"
#include "membership/shard_map.h"
#include "peer/peer_messages_format.h"

namespace kvpool::cluster {

inline constexpr uint8_t kDirectoryHoldersPerKey = 5;

struct DirectoryOptions {
  // Keys recorded at most; each costs 40-80 bytes.
  uint64_t max_entries = 8u << 20;
  // Remember keys whose last holder dropped them (a Bloom ghost, 2 bytes a
  // key) over a window of this many times the keys listed (at least 1024),
  // and say so in lookups (LookupResult::evicted_lately). 0: off.
  uint64_t ghost_ratio = 4;
};

class Directory {
 public:
  // metrics must outlive the directory.
  Directory(const DirectoryOptions& options, MetricsRegistry* metrics);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  void Apply(const PublishBatch& batch);
  // One result per key, in order. Names the listed holders (at most
  // kDirectoryHoldersPerKey) when asker is 0. Otherwise (a hash of who
  // asks), a key held by more (spares) is answered with its own window of
  // them: the listed, then the spares, from asker % their number on. So the readers of a key
  // many nodes hold (a hot prefix every reader keeps) spread over all of
  // its holders, not the newest five.
  std::vector<LookupResult> Lookup(std::span<const KeyId> keys, uint64_t asker = 0) const;
  // The asker Lookup takes for `who` (a node id, or a peer's address): a
  // hash of it, never 0.
  static uint64_t AskerOf(std::string_view who) { return std::hash<std::string_view>{}(who) | 1; }
  // Drops holders that are not alive in `view` with the same incarnation
  // (an incarnation 0 in the view, a static member, matches any). A holder
  // incarnation newer than any seen in a view so far is kept: the node
  // re-registered and its publishes arrived before the view saying so.
  // Apply() ignores batches from an incarnation older than the newest seen.
  void Prune(const MembershipView& view);

  // Anti-entropy (anti_entropy.h). The shards among `shards` (ascending)
  // where the holder's digest differs from the entries of (node,
  // incarnation) here; `owned` (kNumShards flags) limits the comparison to
  // this home's shards (a shard owned here and missing from `shards` holds
  // no key of the holder).
  std::vector<uint32_t> MismatchedShards(const std::string& node, uint64_t incarnation,
                                         std::span<const ShardDigest> shards,
                                         const std::vector<bool>& owned) const;
  // The keys (node, incarnation) holds here in shards[first..], whole shards,
  // until the reply reaches kMaxShardKeys keys; *next is the index to ask
  // from next (shards.size() when done).
  std::vector<KeyId> KeysOf(const std::string& node, uint64_t incarnation,
                            std::span<const uint32_t> shards, uint32_t first,
                            uint32_t* next) const;
  // Drops every entry of the shards not flagged in `owned` (kNumShards
  // flags): a home that lost a shard holds no authority over it, and its
  // entries would be stale if the shard came back.
  void RetainShards(const std::vector<bool>& owned);
  // Drops every entry (a fenced node missed updates while it was away). What
  // it learned of incarnations stays.
  void Clear();

  uint64_t entries() const;
  // Holders that unpublished a key listed here, since the start: with
  // entries(), how long a key stays listed (RemoteReader bounds the reuse
  // of lookup answers by it).
  uint64_t departures() const;
  // Memory held: the slot table and the interned holders.
  uint64_t bytes() const;
  // Memory of the ghost of keys dropped lately (0 when it is off).
  uint64_t ghost_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::cluster
