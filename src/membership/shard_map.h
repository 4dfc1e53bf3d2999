// ShardMap: which node is the home of each shard of the key space.
//
// The key space is split into kNumShards shards by the top bits of the key
// id (already a uniform hash). A shard's home is chosen by weighted
// rendezvous hashing over the view's alive members with weight > 0: each
// member scores -weight / ln(u), u = hash(node_id, shard) in (0, 1), and the
// highest score wins. A member therefore owns about weight/total of the
// shards, the choice depends only on node ids and weights (every node
// computes the same map from the same view), and when a member joins or
// leaves only the shards it gains or loses move. Immutable once computed;
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/key_id.h"
#include "membership/membership.h"

namespace kvpool {

inline constexpr uint32_t kShardBits = 12;
inline constexpr uint32_t kNumShards = 1u << kShardBits;  // 4096

inline uint32_t ShardOf(const KeyId& key) {
  return static_cast<uint32_t>(key.hi >> (64 - kShardBits));
}

class ShardMap {
 public:
  // An empty map: every shard has no home.
  ShardMap() = default;
  static ShardMap Compute(const MembershipView& view);

  uint64_t epoch() const { return epoch_; }
  // A hash of what decides the map (the eligible members' ids and weights):
  // two nodes with equal fingerprints agree on every shard's home node.
  uint64_t fingerprint() const { return fingerprint_; }
  bool empty() const { return owners_.empty(); }
  // The home of a shard, or nullptr when there is no eligible member.
  // REQUIRES: shard < kNumShards. The pointer lives as long as the map.
  const Member* Home(uint32_t shard) const;
  const Member* HomeOf(const KeyId& key) const { return Home(ShardOf(key)); }
  // Shards owned per node id (members owning none are listed with 0).
  std::map<std::string, uint32_t> OwnershipCounts() const;
  // The shards whose home differs between the two maps. A home that kept
  // its node id but changed incarnation counts as moved: the restarted node
  // lost its soft state and must be given the shard's entries again.
  static std::vector<uint32_t> Moved(const ShardMap& before, const ShardMap& after);

  // The rendezvous score of a member for a shard (exposed for tests/tools).
  static double Score(const std::string& node_id, double weight, uint32_t shard);

 private:
  uint64_t epoch_ = 0;
  uint64_t fingerprint_ = 0;
  std::vector<Member> owners_;   // the eligible members
  std::vector<uint16_t> home_;   // shard -> index into owners_; empty when no owners
};

}  // namespace kvpool
