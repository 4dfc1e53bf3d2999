// Helpers for the DRAM tier's tests: cheap uniform key ids and a
// deterministic byte pattern per (key, size).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "common/key_id.h"
#include "common/metrics.h"
#include "store/dram/dram_store.h"

namespace kvpool::dram::testing {

inline uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Key ids are uniform hashes in production; SplitMix gives the same here.
inline KeyId Key(uint64_t i) { return KeyId{SplitMix(i * 2 + 1), SplitMix(i * 2 + 2)}; }

inline void FillPattern(const KeyId& key, uint8_t* dst, uint64_t size) {
  uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t w = SplitMix(key.lo ^ (i * 0x100000001b3ull) ^ size);
    std::memcpy(dst + i, &w, 8);
  }
  const uint64_t w = SplitMix(key.hi ^ size);
  std::memcpy(dst + i, &w, size - i);
}

inline bool CheckPattern(const KeyId& key, const uint8_t* src, uint64_t size) {
  uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t w = SplitMix(key.lo ^ (i * 0x100000001b3ull) ^ size);
    if (std::memcmp(src + i, &w, 8) != 0) return false;
  }
  const uint64_t w = SplitMix(key.hi ^ size);
  return std::memcmp(src + i, &w, size - i) == 0;
}

inline DramOptions SmallOptions(uint64_t capacity = 16ull << 20, uint64_t slab = 1ull << 20) {
  DramOptions o;
  o.capacity_bytes = capacity;
  o.slab_bytes = slab;
  o.max_value_bytes = capacity;
  o.huge_pages = false;
  o.prefault = true;
  return o;
}

// Reserve + fill with the pattern + commit.
inline Status Put(DramStore& store, const KeyId& key, uint64_t size) {
  auto r = store.Reserve(key, size);
  if (!r.ok()) return std::move(r).TakeStatus();
  FillPattern(key, store.segment_base() + r->offset(), size);
  return store.Commit(std::move(r).value());
}

// Acquire + verify the pattern. NotFound on a miss, Corruption on wrong bytes.
inline Status Get(DramStore& store, const KeyId& key, uint64_t size) {
  auto pin = store.Acquire(key);
  if (!pin.ok()) return std::move(pin).TakeStatus();
  if (pin->size() != size || !CheckPattern(key, store.segment_base() + pin->offset(), size)) {
    return Corruption("pattern mismatch");
  }
  return Status::Ok();
}

}  // namespace kvpool::dram::testing
