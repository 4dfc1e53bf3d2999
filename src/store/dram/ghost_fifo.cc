#include "store/dram/ghost_fifo.h"

#include <algorithm>

namespace kvpool::dram {

void GhostFifo::InsertFp(uint32_t fp) {
  uint32_t* b = Bucket(fp);
  for (uint64_t i = kWays - 1; i > 0; --i) b[i] = b[i - 1];
  b[0] = fp;
}

void GhostFifo::Insert(const KeyId& key) { InsertFp(Fingerprint(key)); }

bool GhostFifo::Take(const KeyId& key) {
  const uint32_t fp = Fingerprint(key);
  uint32_t* b = Bucket(fp);
  for (uint64_t i = 0; i < kWays; ++i) {
    if (b[i] == fp) {
      for (uint64_t j = i; j + 1 < kWays; ++j) b[j] = b[j + 1];
      b[kWays - 1] = 0;
      return true;
    }
  }
  return false;
}

void GhostFifo::Resize(uint64_t capacity) {
  std::vector<uint32_t> old = std::move(fps_);
  buckets_ = std::max<uint64_t>(1, (capacity + kWays - 1) / kWays);
  fps_.assign(buckets_ * kWays, 0);
  // Oldest ways first, so the most recent end up at the front of their bucket.
  for (uint64_t way = kWays; way-- > 0;) {
    for (uint64_t b = 0; b < old.size() / kWays; ++b) {
      const uint32_t fp = old[b * kWays + way];
      if (fp != 0) InsertFp(fp);
    }
  }
}

}  // namespace kvpool::dram
