#include "node/staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <iterator>

#include "protocol/message_format.h"

namespace kvpool {

Result<std::unique_ptr<StagingArea>> StagingArea::Create(uint64_t bytes) {
  bytes = protocol::StagingBytes(bytes);
  int fd = memfd_create("kvpool-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus("memfd_create (staging)", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("ftruncate (staging)", err);
  }
  // The client cannot shrink it under the node's copy (SIGBUS).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("sealing the staging memfd", err);
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus("mmap (staging)", err);
  }
  return std::unique_ptr<StagingArea>(new StagingArea(fd, static_cast<uint8_t*>(p), bytes));
}

StagingArea::StagingArea(int fd, uint8_t* base, uint64_t size)
    : fd_(fd), base_(base), size_(size), free_bytes_(size) {
  free_.emplace(0, size);
}

StagingArea::~StagingArea() {
  munmap(base_, size_);
  ::close(fd_);
}

uint64_t StagingArea::Allocate(uint64_t bytes) {
  bytes = protocol::StagingBytes(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    uint64_t off = it->first;
    uint64_t left = it->second - bytes;
    free_.erase(it);
    if (left > 0) free_.emplace(off + bytes, left);
    free_bytes_ -= bytes;
    return off;
  }
  return kNone;
}

void StagingArea::Free(uint64_t offset, uint64_t bytes) {
  bytes = protocol::StagingBytes(bytes);
  free_bytes_ += bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    free_.erase(next);
  }
  free_.emplace(offset, bytes);
}

}  // namespace kvpool
