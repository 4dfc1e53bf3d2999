// GhostBloom: the keys recently evicted, as two rotating Bloom filters.
//
// Keys are added to the current filter; once it holds `window` keys it
// becomes the previous one and a cleared filter takes its place. A key is
// remembered while it is in either, so for the last `window` to 2 x
// `window` evictions, at 16 bits per key in each filter (about 0.1 % false
// hits over both at 11 probes a key).
// Unlike a bucketed FIFO of fingerprints, how long a key is remembered does
// not depend on which other keys share its bucket, which matters for
// traffic whose keys come back after long, steady intervals (a
// conversation's blocks, re-read on its next turn).
//
// Not thread-safe; owned by an eviction policy under DramStore's mutex, or
// by a cluster directory (keys no node holds any more) under its own.
#pragma once

#include <cstdint>
#include <vector>

#include "common/key_id.h"

namespace kvpool::dram {

class GhostBloom {
 public:
  // probes: bits set and tested per key; 4 instead of 11 is less work a
  // key for about 0.5 % false hits.
  explicit GhostBloom(uint64_t window, int probes = kProbes) : probes_(probes) { Resize(window); }

  void Insert(const KeyId& key);
  bool Contains(const KeyId& key) const;
  // Forgets everything and remembers windows of `window` keys from now on.
  void Resize(uint64_t window);
  uint64_t window() const { return window_; }
  uint64_t bytes() const { return (current_.capacity() + previous_.capacity()) * sizeof(uint64_t); }

 private:
  static constexpr uint64_t kBitsPerKey = 16;
  static constexpr int kProbes = 11;
  int probes_;
  static bool Test(const std::vector<uint64_t>& f, uint64_t bit) {
    return (f[bit >> 6] >> (bit & 63)) & 1;
  }
  // Probe i of key: double hashing over the two halves of the id, each
  // mixed first (ids made by other means than kvpool_key_ids need not look
  // random).
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  struct Hashes {
    uint64_t h1, h2;
  };
  static Hashes HashesOf(const KeyId& key) { return {Mix(key.lo), Mix(key.hi) | 1}; }
  // Mapped onto [0, bits_) by a multiply and a shift rather than a
  // division: the position's high bits are as uniform as its low ones.
  uint64_t Probe(const Hashes& h, int i) const {
    const uint64_t x = h.h1 + static_cast<uint64_t>(i) * h.h2;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * bits_) >> 64);
  }

  std::vector<uint64_t> current_, previous_;
  uint64_t bits_ = 64;
  uint64_t window_ = 0;
  uint64_t added_ = 0;  // keys in current_
};

}  // namespace kvpool::dram
