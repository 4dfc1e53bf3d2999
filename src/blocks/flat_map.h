// FlatMap: an open-addressing hash map (linear probing, backward-shift
// erase) for the descriptor table's per-key and per-hash records: one
// cache line to find an entry, no allocation per entry. Internal to
// src/blocks/.
//
// Not thread-safe; the owner locks. Pointers returned by Find and Emplace
// stay valid until the next Emplace or Erase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/prefetch.h"

namespace kvpool::blocks {

template <typename K, typename V, typename Hash>
class FlatMap {
 public:
  explicit FlatMap(size_t initial = 1024) { Reset(Pow2(initial)); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  V* Find(const K& k) {
    for (size_t i = Home(k);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == k) return &s.value;
    }
  }
  const V* Find(const K& k) const { return const_cast<FlatMap*>(this)->Find(k); }

  // Starts loading k's home slot into the cache, so that a Find, Emplace
  // or Erase of k a little later does not wait for memory.
  void Prefetch(const K& k) const {
    const char* at = reinterpret_cast<const char*>(&slots_[Home(k)]);
    PrefetchForRead(at);
    PrefetchForRead(at + sizeof(Slot) - 1);
  }

  // The entry of k, default-constructed when new; second: whether it is.
  std::pair<V*, bool> Emplace(const K& k) {
    if ((size_ + 1) * 10 > slots_.size() * 7) Grow();
    for (size_t i = Home(k);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) {
        s.used = true;
        s.key = k;
        s.value = V{};
        ++size_;
        return {&s.value, true};
      }
      if (s.key == k) return {&s.value, false};
    }
  }

  void Erase(const K& k) {
    size_t i = Home(k);
    for (;; i = (i + 1) & mask_) {
      if (!slots_[i].used) return;
      if (slots_[i].key == k) break;
    }
    // Backward shift: later entries of the run move into the hole when
    // their home does not lie between the hole and them.
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Slot& s = slots_[j];
      if (!s.used) break;
      const size_t home = Home(s.key);
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i].key = s.key;
        slots_[i].value = std::move(s.value);
        i = j;
      }
    }
    slots_[i].used = false;
    slots_[i].value = V{};
    --size_;
  }

  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.used) fn(s.key, s.value);
    }
  }

 private:
  struct Slot {
    K key{};
    V value{};
    bool used = false;
  };

  static size_t Pow2(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
  }
  size_t Home(const K& k) const {
    uint64_t h = static_cast<uint64_t>(Hash{}(k)) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h >> 32) & mask_;
  }
  void Reset(size_t n) {
    slots_.clear();
    slots_.resize(n);
    mask_ = n - 1;
    size_ = 0;
  }
  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    Reset(old.size() * 2);
    for (Slot& s : old) {
      if (!s.used) continue;
      *Emplace(s.key).first = std::move(s.value);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace kvpool::blocks
