// Size classes of the DRAM slab allocator.
//
// Thread-compatible (a pure function).
#pragma once

#include <cstdint>
#include <vector>

namespace kvpool::dram {

// Slot sizes (ascending, multiples of 64) for slabs of slab_bytes:
// min_class_bytes, then growing by `growth`, plus every power of two, up to
// slab_bytes. Each size is then widened to slab_bytes / n (rounded down to
// 64) where n is how many fit, so a slab wastes less than 64 bytes per slot
// at its tail and exact powers of two (64 KiB, 1 MiB, 4 MiB KV pages) keep
// classes of exactly their size. Sizes with the same slot count collapse
// into one. REQUIRES: slab_bytes is a multiple of 64, growth > 1.
std::vector<uint64_t> BuildSizeClasses(uint64_t min_class_bytes, double growth,
                                       uint64_t slab_bytes);

}  // namespace kvpool::dram
