// Helpers shared by the SSD tier's tests: deterministic values, an
// in-memory store fixture, and a walker that finds records in a file's bytes
// (so tests can damage chosen records). Test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/executor.h"
#include "common/key_id.h"
#include "store/ssd/fault_device.h"
#include "store/ssd/memory_device.h"
#include "store/ssd/ssd_format.h"
#include "store/ssd/ssd_store.h"

namespace kvpool::ssd::testing {

inline KeyId Key(int i) { return MakeKeyId("ssd-test", std::to_string(i)); }

inline std::vector<uint8_t> Value(int i, size_t n) {
  std::vector<uint8_t> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
  for (size_t j = 0; j < n; ++j) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[j] = static_cast<uint8_t>(x);
  }
  return v;
}

// Where a record sits in a file, found by walking the bytes.
struct FoundRecord {
  uint64_t offset;  // of the header in the file
  uint64_t value_len;
};

// Walks every region of `file` like the recovery scan does (header checks
// only) and maps key_hi to the newest record found.
inline std::map<uint64_t, FoundRecord> WalkFile(const std::vector<uint8_t>& file) {
  std::map<uint64_t, FoundRecord> out;
  Superblock sb;
  std::memcpy(&sb, file.data(), sizeof(sb));
  std::map<uint64_t, uint64_t> seq_of;
  for (uint64_t ri = 0; ri < sb.region_count; ++ri) {
    const uint64_t base = kSuperblockBytes + ri * sb.region_bytes;
    RegionHeader rh;
    std::memcpy(&rh, file.data() + base, sizeof(rh));
    if (rh.magic != kRegionMagic || rh.uuid_lo != sb.uuid_lo) continue;
    for (uint64_t pos = kRegionHeaderBytes; pos + kRecordHeaderBytes <= sb.region_bytes;) {
      RecordHeader h;
      std::memcpy(&h, file.data() + base + pos, sizeof(h));
      if (HeaderValidAt(h, {base + pos, rh.seq, static_cast<uint32_t>(sb.uuid_lo)})) {
        if (seq_of[h.key_hi] <= rh.seq) {
          out[h.key_hi] = {base + pos, h.value_len};
          seq_of[h.key_hi] = rh.seq;
        }
        pos += RecordBytes(h.value_len);
      } else {
        pos += kRecordAlign;
      }
    }
  }
  return out;
}

class SsdFixture : public ::testing::Test {
 protected:
  SsdOptions Options(int dirs, uint64_t capacity, uint64_t region = 1 << 20) {
    SsdOptions o;
    for (int i = 0; i < dirs; ++i) o.dirs.push_back("/mem/d" + std::to_string(i));
    o.capacity_bytes = capacity;
    o.region_bytes = region;
    o.buffers_per_dir = 4;
    o.device_factory = FaultDevice::Wrap(disk_.Factory(), faults_);
    return o;
  }
  std::unique_ptr<SsdStore> Open(const SsdOptions& o) {
    auto s = SsdStore::Open(o, &metrics_, &pool_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  std::vector<uint8_t>& File(int dir = 0) {
    return *disk_.File("/mem/d" + std::to_string(dir) + "/kvpool-ssd.data");
  }
  // Reads key i and compares with Value(i, n): OK, or the failing status.
  Status ReadCheck(SsdStore& s, int i, size_t n, bool* wrong_bytes = nullptr) {
    std::vector<uint8_t> got(n);
    Status st = s.Read(Key(i), got.data(), n);
    if (st.ok() && got != Value(i, n)) {
      if (wrong_bytes) *wrong_bytes = true;
      ADD_FAILURE() << "wrong bytes for key " << i;
    }
    return st;
  }

  MemoryDisk disk_;
  std::shared_ptr<FaultInjector> faults_ = std::make_shared<FaultInjector>(7);
  MetricsRegistry metrics_;
  ThreadPool pool_{2, "ssd-test"};
};

}  // namespace kvpool::ssd::testing
