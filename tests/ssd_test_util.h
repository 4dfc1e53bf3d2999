// Helpers for the SSD tier's integration tests (ssd_integration_test.cc,
// ssd_corruption_test.cc): they run the real kvpool-node with --ssd and
// check every value byte for byte, and they read and damage the tier's data
// file directly, using the record layout of src/store/ssd/ssd_format.h.
// Not thread-safe; each test owns its objects.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/node_process.h"
#include "kvpool/kvpool.h"

namespace kvpool::testing {

// A temporary directory under base (default /tmp), removed (after an
// unmount, when Mount succeeded) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Mounts a tmpfs of `size` (e.g. "64m") on a subdirectory; returns its path,
  // or "" with *why set when mount(2) fails (not root, no tmpfs, ...).
  std::string MountTmpfs(const std::string& size, std::string* why);

 private:
  std::string path_;
  std::string mounted_;
};

// A deterministic set of keys "k<i>" in one namespace with sizes spread over
// [min_size, max_size] and Pattern() payloads: verifiable without an oracle.
struct Workload {
  std::string ns;
  uint64_t min_size = 64 << 10;
  uint64_t max_size = 1 << 20;
  uint64_t salt = 1;

  uint64_t Size(uint64_t i) const;
  uint64_t Seed(uint64_t i) const { return salt * 0x100000001b3ull + i; }
  kvpool_key_id Id(uint64_t i) const;
  std::vector<uint8_t> Value(uint64_t i) const { return Pattern(Seed(i), Size(i)); }
  // Number of keys whose sizes add up to at least `bytes`.
  uint64_t KeysFor(uint64_t bytes) const;
};

struct GetResult {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t wrong = 0;   // hits whose size or bytes differ from the workload's value
  uint64_t errors = 0;  // items that were neither OK nor NOT_FOUND
  std::vector<uint8_t> hit;  // per requested index, 1 when it hit byte-exact
};

// Opens a C ABI client on socket (copy mode off: the shared segment path).
kvpool_client* OpenClient(const std::string& socket);

// Puts keys [lo, hi) of w in batches of at most `batch` keys and 16 MiB.
// flush_every > 0: a kvpool_flush after each flush_every bytes put, which
// waits for the SSD tier's region writes, so demotions never find every
// region buffer busy (the tier drops them then: Insert never blocks) and the
// outcome does not depend on the disk's speed. Returns the number of items
// whose status was not OK.
uint64_t PutRange(kvpool_client* c, const Workload& w, uint64_t lo, uint64_t hi, size_t batch = 8,
                  uint64_t flush_every = 0);
// Gets the given indices of w, `batch` keys per call (an engine's batch
// lookups), and compares every byte.
GetResult GetIndices(kvpool_client* c, const Workload& w, const std::vector<uint64_t>& idx,
                     size_t batch = 8);
GetResult GetRange(kvpool_client* c, const Workload& w, uint64_t lo, uint64_t hi, size_t batch = 8);

// For a node whose socket cannot be reached: does its directory, socket and
// process still exist, and the tail of its log. (Seen twice on a shared
// machine: a node that had just come up was gone moments later; this tells
// a killed process from a removed directory.)
std::string NodeDiagnosis(const NodeProcess& node);

// kvpool_flush (the durability barrier); true on OK.
bool Flush(kvpool_client* c);

// The "ssd" object of /api/v1/status (null json when absent or unreachable).
nlohmann::json SsdStatus(const NodeProcess& node);
// A counter or gauge from /metrics, 0 when absent (a counter never touched).
double MetricOr0(const NodeProcess& node, const std::string& series);

// Arguments for a node with a DRAM tier of `dram` and an SSD tier on dirs.
std::vector<std::string> SsdArgs(const std::string& dirs, const std::string& dram,
                                 const std::string& ssd_capacity, const std::string& region,
                                 const std::vector<std::string>& extra = {});

// ---- The data file (store/ssd/ssd_format.h) --------------------------------

std::string DataFile(const std::string& dir);  // <dir>/kvpool-ssd.data

// Raises the system's hugetlb page count (vm.nr_hugepages) by `pages` for
// its lifetime, for a node whose segment should be on huge pages. ok() is
// false, with why(), where that cannot be done (not root, no memory).
// System-wide: tests using it run alone (tests/CMakeLists.txt,
// KVPOOL_SERIAL_TESTS), so no other node takes the pages.
class HugePageReserve {
 public:
  explicit HugePageReserve(int pages);
  ~HugePageReserve();
  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  long before_ = -1;
  std::string why_;
};

struct RecordLoc {
  uint64_t offset = 0;     // of the record header in the file
  uint64_t value_len = 0;
  uint64_t key_hi = 0, key_lo = 0;
  uint64_t region_seq = 0;
  bool payload_ok = false;  // the payload matches its data_crc
  // Bytes of header + payload (without the zero pad).
  uint64_t end() const { return offset + 64 + value_len; }
};

// Every record in the file that a region scan would accept (header CRC,
// placement, region sequence and file incarnation check out), in file order.
// Reads through the page cache. Empty when the superblock is not valid.
std::vector<RecordLoc> ParseRecords(const std::string& data_path);

// Raw file access for damage (pwrite through the page cache, then
// fdatasync, so a node's O_DIRECT reads see the change).
std::vector<uint8_t> ReadAt(const std::string& path, uint64_t offset, uint64_t len);
void WriteAt(const std::string& path, uint64_t offset, const std::vector<uint8_t>& bytes);
void FlipBit(const std::string& path, uint64_t offset, int bit);

}  // namespace kvpool::testing
