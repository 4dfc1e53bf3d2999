// FrequencySketch: how often each key was seen lately, approximately, in
// bounded memory (the count-min sketch of TinyLFU, Einziger et al., 2017).
//
// 4-bit counters, saturating at 15; a key's estimate is the least of its
// kHashes counters, so collisions only ever raise it. After `sample`
// increments every counter halves, so popularity fades and the estimates
// follow the last few samples' worth of traffic.
//
// Used by the tinylfu eviction policy (under DramStore's lock) and by the
// SSD tier's admission (TieredStore, under its own lock). Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "common/key_id.h"

namespace kvpool::dram {

class FrequencySketch {
 public:
  static constexpr uint32_t kMax = 15;

  // counters: rounded up to a power of two (at least 64); sample: increments
  // between halvings (at least 1).
  FrequencySketch(uint64_t counters, uint64_t sample) { Resize(counters, sample); }

  void Increment(const KeyId& key);
  uint32_t Estimate(const KeyId& key) const;
  // Forgets everything and sizes the sketch anew.
  void Resize(uint64_t counters, uint64_t sample);
  uint64_t counters() const { return table_.size() * 16; }
  uint64_t bytes() const { return table_.capacity() * sizeof(uint64_t); }
  // Halvings so far.
  uint64_t halvings() const { return halvings_; }

 private:
  static constexpr int kHashes = 4;
  // Counter i of key: double hashing over one mixed 64-bit hash of the id
  // (lo's low 32 bits are a namespace tag, shared by many keys: mixed in,
  // not used alone).
  struct Hashes {
    uint64_t h1, h2;
  };
  static Hashes HashesOf(const KeyId& key) {
    uint64_t z = key.hi ^ (key.lo * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return {z, (z >> 32) | 1};
  }
  uint64_t Counter(const Hashes& h, int i) const { return (h.h1 + i * h.h2) & mask_; }
  uint32_t Get(uint64_t c) const { return (table_[c >> 4] >> ((c & 15) * 4)) & 0xf; }

  std::vector<uint64_t> table_;  // 16 counters a word
  uint64_t mask_ = 0;            // counters - 1
  uint64_t sample_ = 0;
  uint64_t increments_ = 0;  // since the last halving
  uint64_t halvings_ = 0;
};

}  // namespace kvpool::dram
