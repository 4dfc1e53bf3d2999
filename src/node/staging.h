// StagingArea: one local connection's writable memory for its
// reservations, when clients map the segment read-only.
//
// A memfd of a fixed size, sealed against shrinking and growing, that the
// client maps read-write: a Reserve hands out a range of it, the client
// writes the value there, and Commit copies the range into the entry's
// segment slot. Pages are allocated when first touched, so an idle or
// small writer costs little. Ranges are first-fit from a free list,
// coalesced on free. Not thread-safe (one connection's, on the loop thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "common/status.h"

namespace kvpool {

class StagingArea {
 public:
  static constexpr uint64_t kNone = ~0ull;
  static Result<std::unique_ptr<StagingArea>> Create(uint64_t bytes);
  ~StagingArea();
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // The offset of a free range of `bytes`, or kNone when none is left.
  uint64_t Allocate(uint64_t bytes);
  // Returns a range from Allocate.
  void Free(uint64_t offset, uint64_t bytes);
  const uint8_t* data(uint64_t offset) const { return base_ + offset; }
  uint64_t free_bytes() const { return free_bytes_; }

 private:
  StagingArea(int fd, uint8_t* base, uint64_t size);

  int fd_;
  uint8_t* base_;
  uint64_t size_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint, coalesced
};

}  // namespace kvpool
