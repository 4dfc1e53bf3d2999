// SlotIndex: key id -> slot, an open-addressing Robin Hood hash table with
// backward-shift deletion (no tombstones, so churn never degrades it).
//
// An entry is 8 bytes: a 32-bit tag (bits of the key id, which is already a
// uniform hash) and the slot. The full key lives in the slot's metadata;
// lookups compare it, through the caller's key_of(slot), only when the tag
// matches. The tag also gives the home bucket (tag * capacity >> 32), so
// entries can be moved and rehashed without reading any key. The table grows
// by 4/3 past 90% load and shrinks under 30%, which keeps it between ~70% and
// 90% full in steady state (8.9 to 11.4 bytes per entry).
//
// Not thread-safe; owned by DramStore under its mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "common/check.h"
#include "common/key_id.h"

namespace kvpool::dram {

class SlotIndex {
 public:
  static constexpr uint32_t kNotFound = UINT32_MAX;

  explicit SlotIndex(uint64_t initial_capacity = 64) { Rehash(initial_capacity); }

  uint64_t size() const { return size_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t bytes() const { return capacity_ * sizeof(Entry); }

  // The slot of `key`, or kNotFound. key_of(slot) returns the slot's KeyId.
  template <typename KeyOf>
  uint32_t Find(const KeyId& key, const KeyOf& key_of) const {
    const uint32_t tag = Tag(key);
    uint64_t pos = Home(tag);
    for (uint64_t d = 0;; ++d) {
      const Entry& e = table_[pos];
      if (e.slot == kEmpty || Distance(pos, e.tag) < d) return kNotFound;
      if (e.tag == tag && key_of(e.slot) == key) return e.slot;
      pos = Next(pos);
    }
  }

  // REQUIRES: key is absent; slot != kNotFound.
  void Insert(const KeyId& key, uint32_t slot) {
    KVPOOL_CHECK(slot != kEmpty);
    if ((size_ + 1) * 10 > capacity_ * 9) Rehash((size_ + 1) * 4 / 3 + 1);
    Place(Entry{Tag(key), slot});
    ++size_;
  }

  // Removes the entry of `key` that points at `slot`; false when absent.
  bool Erase(const KeyId& key, uint32_t slot) {
    const uint32_t tag = Tag(key);
    uint64_t pos = Home(tag);
    for (uint64_t d = 0;; ++d) {
      const Entry& e = table_[pos];
      if (e.slot == kEmpty || Distance(pos, e.tag) < d) return false;
      if (e.tag == tag && e.slot == slot) break;
      pos = Next(pos);
    }
    // Backward shift: pull each displaced follower one step towards home.
    uint64_t next = Next(pos);
    while (table_[next].slot != kEmpty && Distance(next, table_[next].tag) > 0) {
      table_[pos] = table_[next];
      pos = next;
      next = Next(next);
    }
    table_[pos] = Entry{};
    --size_;
    if (capacity_ > kMinCapacity && size_ * 10 < capacity_ * 3) Rehash(size_ * 4 / 3 + 1);
    return true;
  }

  // Calls fn(slot) for every entry (tests, consistency checks).
  template <typename Fn>
  void ForEach(const Fn& fn) const {
    for (uint64_t i = 0; i < capacity_; ++i) {
      if (table_[i].slot != kEmpty) fn(table_[i].slot);
    }
  }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  static constexpr uint64_t kMinCapacity = 16;
  struct Entry {
    uint32_t tag = 0;
    uint32_t slot = kEmpty;
  };

  static uint32_t Tag(const KeyId& key) { return static_cast<uint32_t>(key.lo >> 32); }
  // Lemire's multiply-shift: any capacity, no modulo, monotonic in the tag.
  uint64_t Home(uint32_t tag) const { return (static_cast<uint64_t>(tag) * capacity_) >> 32; }
  uint64_t Next(uint64_t pos) const { return pos + 1 == capacity_ ? 0 : pos + 1; }
  uint64_t Distance(uint64_t pos, uint32_t tag) const {
    const uint64_t home = Home(tag);
    return pos >= home ? pos - home : pos + capacity_ - home;
  }

  void Place(Entry e) {
    uint64_t pos = Home(e.tag);
    for (uint64_t d = 0;; ++d) {
      Entry& cur = table_[pos];
      if (cur.slot == kEmpty) {
        cur = e;
        return;
      }
      const uint64_t cd = Distance(pos, cur.tag);
      if (cd < d) {  // Robin Hood: the richer entry moves on.
        std::swap(cur, e);
        d = cd;
      }
      pos = Next(pos);
    }
  }

  void Rehash(uint64_t new_capacity) {
    new_capacity = std::max(new_capacity, kMinCapacity);
    KVPOOL_CHECK(new_capacity > size_ && new_capacity <= (uint64_t{1} << 32));
    std::unique_ptr<Entry[]> old = std::move(table_);
    const uint64_t old_capacity = capacity_;
    table_ = std::make_unique<Entry[]>(new_capacity);
    capacity_ = new_capacity;
    for (uint64_t i = 0; i < old_capacity; ++i) {
      if (old[i].slot != kEmpty) Place(old[i]);
    }
  }

  std::unique_ptr<Entry[]> table_;
  uint64_t capacity_ = 0;
  uint64_t size_ = 0;
};

}  // namespace kvpool::dram
