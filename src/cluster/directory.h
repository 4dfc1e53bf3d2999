// Directory: the home node's soft-state map key id -> the nodes (with
// incarnation) that hold the key, fed by holders' Publish batches.
//
// Bounded: at most max_entries keys (new keys beyond it are not recorded:
// a lookup of them misses, which is safe) and kDirectoryHoldersPerKey
// holders per key (the newest replace the oldest). Entries of dead
// incarnations are dropped by Prune() when the membership view changes.
// Stored as a flat open-addressing table of 32-byte slots (holders are
// 16-bit indexes into an interned (node, incarnation) table), at most 80%
// full: 40-80 bytes per key. Memory is reported (kvpool_directory_entries,
// kvpool_directory_bytes).
//
// Thread-safe (one mutex; no call leaves the process).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cluster/membership.h"
#include "cluster/peer_messages_format.h"
#include "common/metrics.h"

namespace kvpool::cluster {

inline constexpr uint8_t kDirectoryHoldersPerKey = 5;

struct DirectoryOptions {
  // Keys recorded at most; each costs 40-80 bytes.
  uint64_t max_entries = 8u << 20;
};

class Directory {
 public:
  // metrics must outlive the directory.
  Directory(const DirectoryOptions& options, MetricsRegistry* metrics);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  void Apply(const PublishBatch& batch);
  // One result per key, in order.
  std::vector<LookupResult> Lookup(std::span<const KeyId> keys) const;
  // Drops holders that are not alive in `view` with the same incarnation
  // (an incarnation 0 in the view, a static member, matches any). A holder
  // incarnation newer than any seen in a view so far is kept: the node
  // re-registered and its publishes arrived before the view saying so.
  // Apply() ignores batches from an incarnation older than the newest seen.
  void Prune(const MembershipView& view);

  uint64_t entries() const;
  // Memory held: the slot table and the interned holders.
  uint64_t bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::cluster
