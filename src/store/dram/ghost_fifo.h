// GhostFifo: S3-FIFO's ghost queue, the fingerprints of keys recently evicted
// from the small queue. A key that comes back while remembered goes straight
// to the main queue.
//
// Stored as 4-way buckets of 32-bit fingerprints, each bucket a tiny FIFO
// (insert at way 0, the oldest falls off way 3): an approximation of one FIFO
// of `capacity` keys at 4 bytes per key, with ~capacity/2^32 false hits.
//
// Not thread-safe; owned by the eviction policy under DramStore's mutex.
#pragma once

#include <cstdint>
#include <vector>

#include "common/key_id.h"

namespace kvpool::dram {

class GhostFifo {
 public:
  explicit GhostFifo(uint64_t capacity) { Resize(capacity); }

  void Insert(const KeyId& key);
  // True (and forgets the key) when the key is remembered.
  bool Take(const KeyId& key);
  // Keeps the remembered keys that fit, the most recent first.
  void Resize(uint64_t capacity);
  uint64_t capacity() const { return fps_.size(); }
  uint64_t bytes() const { return fps_.capacity() * sizeof(uint32_t); }

 private:
  static constexpr uint64_t kWays = 4;
  static uint32_t Fingerprint(const KeyId& key) {
    // The index uses bits of `lo`; the ghost uses `hi`, so they are independent.
    const uint32_t fp = static_cast<uint32_t>(key.hi >> 32);
    return fp == 0 ? 1 : fp;
  }
  uint32_t* Bucket(uint32_t fp) {
    return &fps_[((static_cast<uint64_t>(fp) * buckets_) >> 32) * kWays];
  }
  void InsertFp(uint32_t fp);

  std::vector<uint32_t> fps_;  // 0 = empty
  uint64_t buckets_ = 0;
};

}  // namespace kvpool::dram
