// MemoryDevice: a Device in RAM for fast tests. MemoryDisk holds the bytes
// of any number of named "files", so a store can be dropped and reopened
// over the same contents (a restart), and tests can edit the bytes directly
// (bit rot, torn and misplaced records). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/ssd/device.h"

namespace kvpool {

class MemoryDisk {
 public:
  // Devices opened through this factory share this disk's files; the disk
  // must outlive them. A file is created zeroed, or resized on reopen.
  DeviceFactory Factory();
  // The bytes of a file (nullptr if it was never opened). Tests may edit
  // them; the store sees the edits on its next read.
  std::vector<uint8_t>* File(const std::string& path);
  std::vector<std::string> Paths() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::vector<uint8_t>>> files_;  // protected by mu_
};

}  // namespace kvpool
