// Device: block I/O on one preallocated file, the seam under the SSD tier.
//
// Implementations: the real one (O_DIRECT through io_uring, with a
// pread/pwrite fallback chosen at open when io_uring is unavailable), an
// in-memory one for fast tests, and a fault-injecting wrapper (EIO with a
// probability, bit flips, torn writes, latency, a full disk).
//
// Offsets and lengths are multiples of kDeviceBlock and buffers are aligned
// to it (O_DIRECT). Thread-safe: concurrent Read/Write calls are allowed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace kvpool {

inline constexpr uint64_t kDeviceBlock = 4096;

class Device {
 public:
  virtual ~Device() = default;
  virtual uint64_t size() const = 0;
  // REQUIRES: offset, len multiples of kDeviceBlock; buf aligned likewise;
  // offset + len <= size(). IOError on failure (errno in the message);
  // ResourceExhausted when a write finds the disk full (ENOSPC).
  virtual Status Read(uint64_t offset, void* buf, uint64_t len) = 0;
  virtual Status Write(uint64_t offset, const void* buf, uint64_t len) = 0;
  // A gather write: the pieces, back to back from offset, each under the
  // same rules as Write's buffer. The base writes them one by one.
  struct Piece {
    const void* buf;
    uint64_t len;
  };
  virtual Status WriteV(uint64_t offset, std::span<const Piece> pieces);
  // Makes completed writes durable (fdatasync).
  virtual Status Sync() = 0;
  // "io_uring", "pread", "memory", ...: for logs and status.
  virtual std::string kind() const = 0;
};

// Opens (creating and preallocating when needed) the file at `path` with
// `size` bytes. The seam tests use to put a FaultDevice under the store.
using DeviceFactory =
    std::function<Result<std::unique_ptr<Device>>(const std::string& path, uint64_t size)>;

// The real device factory: O_DIRECT, io_uring when available.
DeviceFactory FileDeviceFactory();

}  // namespace kvpool
