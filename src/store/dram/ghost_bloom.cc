#include "store/dram/ghost_bloom.h"

#include <algorithm>

namespace kvpool::dram {

void GhostBloom::Insert(const KeyId& key) {
  const Hashes h = HashesOf(key);
  for (int i = 0; i < probes_; ++i) {
    const uint64_t bit = Probe(h, i);
    current_[bit >> 6] |= uint64_t{1} << (bit & 63);
  }
  if (++added_ >= window_) {
    current_.swap(previous_);
    std::fill(current_.begin(), current_.end(), 0);
    added_ = 0;
  }
}

bool GhostBloom::Contains(const KeyId& key) const {
  const Hashes h = HashesOf(key);
  bool in_current = true, in_previous = true;
  for (int i = 0; i < probes_ && (in_current || in_previous); ++i) {
    const uint64_t bit = Probe(h, i);
    in_current = in_current && Test(current_, bit);
    in_previous = in_previous && Test(previous_, bit);
  }
  return in_current || in_previous;
}

void GhostBloom::Resize(uint64_t window) {
  window_ = std::max<uint64_t>(1, window);
  bits_ = std::max<uint64_t>(64, (window_ * kBitsPerKey + 63) / 64 * 64);
  current_.assign(bits_ / 64, 0);
  previous_.assign(bits_ / 64, 0);
  added_ = 0;
}

}  // namespace kvpool::dram
