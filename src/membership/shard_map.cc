#include "membership/shard_map.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"

namespace kvpool {
namespace {

// FNV-1a: a stable hash of the node id. std::hash is not the same across
// builds and every node must compute the same map.
uint64_t HashId(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// splitmix64 finalizer: spreads (id hash, shard) over all 64 bits, so
// neighbouring shards get unrelated scores.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double ScoreFromHash(uint64_t id_hash, double weight, uint32_t shard) {
  uint64_t h = Mix(id_hash ^ Mix(shard));
  // u in (0, 1), never 0 or 1, so ln(u) is finite and negative.
  double u = (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  return -weight / std::log(u);
}

}  // namespace

double ShardMap::Score(const std::string& node_id, double weight, uint32_t shard) {
  return ScoreFromHash(HashId(node_id), weight, shard);
}

ShardMap ShardMap::Compute(const MembershipView& view) {
  ShardMap map;
  map.epoch_ = view.epoch;
  for (const Member& m : view.members) {
    if (m.state == MemberState::kAlive && m.weight > 0 && std::isfinite(m.weight)) {
      map.owners_.push_back(m);
    }
  }
  if (map.owners_.empty()) return map;
  KVPOOL_CHECK(map.owners_.size() <= std::numeric_limits<uint16_t>::max());
  std::vector<uint64_t> id_hash;
  id_hash.reserve(map.owners_.size());
  for (const Member& m : map.owners_) id_hash.push_back(HashId(m.node_id));
  map.fingerprint_ = 0x6b767073686172ull;  // "kvpshar"
  for (size_t i = 0; i < map.owners_.size(); ++i) {
    uint64_t w = 0;
    static_assert(sizeof(w) == sizeof(double));
    std::memcpy(&w, &map.owners_[i].weight, sizeof(w));
    map.fingerprint_ = Mix(map.fingerprint_ ^ id_hash[i]) ^ Mix(w);
  }
  map.home_.resize(kNumShards);
  for (uint32_t s = 0; s < kNumShards; ++s) {
    size_t best = 0;
    double best_score = -1;
    for (size_t i = 0; i < map.owners_.size(); ++i) {
      double score = ScoreFromHash(id_hash[i], map.owners_[i].weight, s);
      // Ties (practically impossible) go to the smaller id: members are
      // sorted by id and a later one must strictly beat an earlier one.
      if (score > best_score) {
        best_score = score;
        best = i;
      }
    }
    map.home_[s] = static_cast<uint16_t>(best);
  }
  return map;
}

const Member* ShardMap::Home(uint32_t shard) const {
  KVPOOL_CHECK(shard < kNumShards);
  if (owners_.empty()) return nullptr;
  return &owners_[home_[shard]];
}

std::map<std::string, uint32_t> ShardMap::OwnershipCounts() const {
  std::map<std::string, uint32_t> counts;
  for (const Member& m : owners_) counts[m.node_id] = 0;
  for (uint16_t i : home_) ++counts[owners_[i].node_id];
  return counts;
}

std::vector<uint32_t> ShardMap::Moved(const ShardMap& before, const ShardMap& after) {
  std::vector<uint32_t> moved;
  for (uint32_t s = 0; s < kNumShards; ++s) {
    const Member* a = before.Home(s);
    const Member* b = after.Home(s);
    if (a == nullptr && b == nullptr) continue;
    if (a == nullptr || b == nullptr || a->node_id != b->node_id ||
        a->incarnation != b->incarnation) {
      moved.push_back(s);
    }
  }
  return moved;
}

}  // namespace kvpool
