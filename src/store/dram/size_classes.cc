#include "store/dram/size_classes.h"

#include <algorithm>
#include <map>

#include "common/check.h"

namespace kvpool::dram {
namespace {
uint64_t RoundUp64(uint64_t v) { return (v + 63) & ~uint64_t{63}; }
}  // namespace

std::vector<uint64_t> BuildSizeClasses(uint64_t min_class_bytes, double growth,
                                       uint64_t slab_bytes) {
  KVPOOL_CHECK(slab_bytes % 64 == 0 && slab_bytes >= 64 && growth > 1.0);
  const uint64_t first = std::min(RoundUp64(std::max<uint64_t>(min_class_bytes, 1)), slab_bytes);
  std::vector<uint64_t> candidates;
  for (uint64_t s = first; s < slab_bytes;) {
    candidates.push_back(s);
    s = std::max(s + 64, RoundUp64(static_cast<uint64_t>(static_cast<double>(s) * growth)));
  }
  for (uint64_t p = 64; p < slab_bytes; p <<= 1) {
    if (p >= first) candidates.push_back(p);
  }
  candidates.push_back(slab_bytes);
  // slots per slab -> widest size with that count.
  std::map<uint64_t, uint64_t> by_count;
  for (uint64_t s : candidates) {
    const uint64_t n = slab_bytes / s;
    const uint64_t widened = (slab_bytes / n) & ~uint64_t{63};
    uint64_t& best = by_count[n];
    best = std::max(best, widened);
  }
  std::vector<uint64_t> out;
  for (const auto& [n, s] : by_count) out.push_back(s);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kvpool::dram
