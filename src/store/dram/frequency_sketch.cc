#include "store/dram/frequency_sketch.h"

#include <algorithm>
#include <bit>

namespace kvpool::dram {

void FrequencySketch::Increment(const KeyId& key) {
  const Hashes h = HashesOf(key);
  // Only the least of the key's counters rise (conservative update): a key
  // that shares its other counters with busier keys does not push them up.
  uint64_t c[kHashes];
  uint32_t least = kMax;
  for (int i = 0; i < kHashes; ++i) {
    c[i] = Counter(h, i);
    least = std::min(least, Get(c[i]));
  }
  if (least < kMax) {
    for (int i = 0; i < kHashes; ++i) {
      if (Get(c[i]) == least) table_[c[i] >> 4] += uint64_t{1} << ((c[i] & 15) * 4);
    }
  }
  if (++increments_ >= sample_) {
    // Every counter halves: each nibble shifted right, the bit that crossed
    // into the nibble below cleared.
    for (uint64_t& w : table_) w = (w >> 1) & 0x7777777777777777ull;
    increments_ = 0;
    ++halvings_;
  }
}

uint32_t FrequencySketch::Estimate(const KeyId& key) const {
  const Hashes h = HashesOf(key);
  uint32_t least = kMax;
  for (int i = 0; i < kHashes; ++i) least = std::min(least, Get(Counter(h, i)));
  return least;
}

void FrequencySketch::Resize(uint64_t counters, uint64_t sample) {
  counters = std::bit_ceil(std::max<uint64_t>(64, counters));
  table_.assign(counters / 16, 0);
  mask_ = counters - 1;
  sample_ = std::max<uint64_t>(1, sample);
  increments_ = 0;
}

}  // namespace kvpool::dram
