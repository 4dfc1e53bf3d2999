// FileDevice: the real Device, one preallocated file. Opens with O_DIRECT
// (falls back to buffered I/O where the filesystem refuses it, e.g. tmpfs)
// and does I/O through a small pool of io_uring rings (falls back to
// pread/pwrite when io_uring_queue_init fails). Both choices are made once
// at open and logged; kind() reports them ("io_uring+direct", ...).
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "store/ssd/device.h"

namespace kvpool {

struct FileDeviceOptions {
  // false: never try io_uring (pread/pwrite). For comparisons and tests.
  bool use_io_uring = true;
  // false: buffered I/O. O_DIRECT is still dropped automatically when the
  // filesystem refuses it.
  bool direct_io = true;
  // Rings in the pool; concurrent I/Os beyond this wait for a ring.
  int rings = 4;
  // Large writes are split into chunks of this size submitted together, so
  // the device sees several requests in flight (like fio's iodepth).
  uint64_t write_chunk_bytes = 2ull << 20;
};

DeviceFactory FileDeviceFactory(const FileDeviceOptions& options);

}  // namespace kvpool
