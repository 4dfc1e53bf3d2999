#include "ssd_test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "kvpool/client.h"
#include "store/ssd/ssd_format.h"

namespace kvpool::testing {

namespace {
uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
}  // namespace

TempDir::TempDir(const std::string& base) {
  std::string tmpl = base + "/kvpool-ssd-it-XXXXXX";
  char* p = mkdtemp(tmpl.data());
  EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl << ": " << std::strerror(errno);
  path_ = p != nullptr ? p : "";
}

TempDir::~TempDir() {
  if (!mounted_.empty()) umount2(mounted_.c_str(), MNT_DETACH);
  if (!path_.empty()) {
    std::string cmd = "rm -rf '" + path_ + "'";
    int r = system(cmd.c_str());
    (void)r;
  }
}

std::string TempDir::MountTmpfs(const std::string& size, std::string* why) {
  std::string mp = path_ + "/tmpfs";
  if (mkdir(mp.c_str(), 0755) != 0) {
    *why = "mkdir " + mp + ": " + std::strerror(errno);
    return "";
  }
  std::string data = "size=" + size + ",mode=0755";
  if (mount("tmpfs", mp.c_str(), "tmpfs", 0, data.c_str()) != 0) {
    *why = "mount -t tmpfs -o " + data + " " + mp + ": " + std::strerror(errno);
    return "";
  }
  mounted_ = mp;
  return mp;
}

uint64_t Workload::Size(uint64_t i) const {
  if (max_size <= min_size) return min_size;
  return min_size + Mix(i * 0x9E3779B97F4A7C15ull + salt) % (max_size - min_size + 1);
}

kvpool_key_id Workload::Id(uint64_t i) const { return Client::KeyId(ns, "k" + std::to_string(i)); }

uint64_t Workload::KeysFor(uint64_t bytes) const {
  uint64_t n = 0, sum = 0;
  while (sum < bytes) sum += Size(n++);
  return n;
}

kvpool_client* OpenClient(const std::string& socket) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = socket.c_str();
  o.max_connections = 2;
  o.timeout_ms = 20000;  // gets park on SSD promotions; the disk may be slow
  kvpool_status st;
  kvpool_client* c = kvpool_open(&o, &st);
  EXPECT_NE(c, nullptr) << kvpool_status_name(st) << " " << kvpool_last_error();
  return c;
}

uint64_t PutRange(kvpool_client* c, const Workload& w, uint64_t lo, uint64_t hi, size_t batch,
                  uint64_t flush_every) {
  uint64_t failed = 0;
  uint64_t since_flush = 0;
  std::vector<kvpool_key_id> ids;
  std::vector<std::vector<uint8_t>> vals;
  std::vector<const void*> ptrs;
  std::vector<uint64_t> sizes;
  std::vector<kvpool_status> st;
  uint64_t i = lo;
  while (i < hi) {
    ids.clear();
    vals.clear();
    uint64_t bytes = 0;
    while (i < hi && ids.size() < batch && (ids.empty() || bytes + w.Size(i) <= (16u << 20))) {
      ids.push_back(w.Id(i));
      vals.push_back(w.Value(i));
      bytes += w.Size(i);
      ++i;
    }
    ptrs.clear();
    sizes.clear();
    for (auto& v : vals) {
      ptrs.push_back(v.data());
      sizes.push_back(v.size());
    }
    st.assign(ids.size(), -1);
    kvpool_status rc = kvpool_put(c, ids.data(), ptrs.data(), sizes.data(), ids.size(), st.data());
    for (size_t k = 0; k < ids.size(); ++k) {
      kvpool_status s = st[k] == -1 ? rc : st[k];
      if (s != KVPOOL_OK) {
        if (failed == 0) {
          ADD_FAILURE() << "put of key " << (i - ids.size() + k) << ": " << kvpool_status_name(s)
                        << " " << kvpool_last_error();
        }
        ++failed;
      }
    }
    since_flush += bytes;
    if (flush_every > 0 && since_flush >= flush_every) {
      since_flush = 0;
      if (!Flush(c)) ++failed;
    }
  }
  return failed;
}

GetResult GetIndices(kvpool_client* c, const Workload& w, const std::vector<uint64_t>& idx,
                     size_t batch) {
  GetResult r;
  r.hit.assign(idx.size(), 0);
  std::vector<kvpool_key_id> ids;
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<void*> ptrs;
  std::vector<uint64_t> caps, got;
  std::vector<kvpool_status> st;
  for (size_t at = 0; at < idx.size(); at += batch) {
    size_t n = std::min(batch, idx.size() - at);
    ids.clear();
    bufs.resize(n);
    ptrs.clear();
    caps.clear();
    for (size_t k = 0; k < n; ++k) {
      uint64_t i = idx[at + k];
      ids.push_back(w.Id(i));
      // One byte more than the value: a longer stored value would show.
      bufs[k].assign(w.Size(i) + 1, 0xA5);
      ptrs.push_back(bufs[k].data());
      caps.push_back(bufs[k].size());
    }
    got.assign(n, 0);
    st.assign(n, -1);
    kvpool_status rc = kvpool_get(c, ids.data(), ptrs.data(), caps.data(), n, got.data(), st.data());
    for (size_t k = 0; k < n; ++k) {
      uint64_t i = idx[at + k];
      kvpool_status s = rc != KVPOOL_OK ? rc : st[k];
      if (s == KVPOOL_OK) {
        std::vector<uint8_t> want = w.Value(i);
        if (got[k] != want.size() || std::memcmp(bufs[k].data(), want.data(), want.size()) != 0) {
          if (r.wrong == 0) {
            ADD_FAILURE() << "key " << w.ns << "/k" << i << ": wrong bytes (size " << got[k]
                          << ", want " << want.size() << ")";
          }
          ++r.wrong;
        } else {
          ++r.hits;
          r.hit[at + k] = 1;
        }
      } else if (s == KVPOOL_NOT_FOUND) {
        ++r.misses;
      } else {
        if (r.errors == 0) {
          ADD_FAILURE() << "get of key " << i << ": " << kvpool_status_name(s) << " "
                        << kvpool_last_error();
        }
        ++r.errors;
      }
    }
  }
  return r;
}

GetResult GetRange(kvpool_client* c, const Workload& w, uint64_t lo, uint64_t hi, size_t batch) {
  std::vector<uint64_t> idx;
  for (uint64_t i = lo; i < hi; ++i) idx.push_back(i);
  return GetIndices(c, w, idx, batch);
}

std::string NodeDiagnosis(const NodeProcess& node) {
  struct stat st;
  std::string d = "dir " + node.dir() + (stat(node.dir().c_str(), &st) == 0 ? " exists" : " is gone");
  d += ", socket " + std::string(stat(node.socket().c_str(), &st) == 0 ? "exists" : "is gone");
  d += ", pid " + std::to_string(node.pid()) +
       (node.pid() > 0 && ::kill(node.pid(), 0) == 0 ? " alive" : " not running");
  std::string log = node.Log();
  if (log.size() > 3000) log = log.substr(log.size() - 3000);
  return d + "; log tail:\n" + log;
}

bool Flush(kvpool_client* c) {
  kvpool_status s = kvpool_flush(c);
  EXPECT_EQ(s, KVPOOL_OK) << kvpool_status_name(s) << " " << kvpool_last_error();
  return s == KVPOOL_OK;
}

nlohmann::json SsdStatus(const NodeProcess& node) {
  int code = 0;
  std::string body = node.HttpGet("/api/v1/status", &code);
  if (code != 200) return nullptr;
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("ssd")) return nullptr;
  return j["ssd"];
}

double MetricOr0(const NodeProcess& node, const std::string& series) {
  double v = node.Metric(series);
  return v < 0 ? 0 : v;
}

std::vector<std::string> SsdArgs(const std::string& dirs, const std::string& dram,
                                 const std::string& ssd_capacity, const std::string& region,
                                 const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"--dram-capacity", dram,         "--slab-size",       "1MiB",
                                "--ssd",           dirs,         "--ssd-capacity",    ssd_capacity,
                                "--ssd-region-size", region};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string DataFile(const std::string& dir) { return dir + "/kvpool-ssd.data"; }

std::vector<uint8_t> ReadAt(const std::string& path, uint64_t offset, uint64_t len) {
  std::vector<uint8_t> out(len);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ADD_FAILURE() << "open " << path << ": " << std::strerror(errno);
    return {};
  }
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, out.data() + done, len - done, static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

void WriteAt(const std::string& path, uint64_t offset, const std::vector<uint8_t>& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << "open " << path << ": " << std::strerror(errno);
  ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
  EXPECT_EQ(n, static_cast<ssize_t>(bytes.size())) << std::strerror(errno);
  EXPECT_EQ(::fdatasync(fd), 0) << std::strerror(errno);
  ::close(fd);
}

void FlipBit(const std::string& path, uint64_t offset, int bit) {
  std::vector<uint8_t> b = ReadAt(path, offset, 1);
  ASSERT_EQ(b.size(), 1u);
  b[0] ^= static_cast<uint8_t>(1u << bit);
  WriteAt(path, offset, b);
}

std::vector<RecordLoc> ParseRecords(const std::string& data_path) {
  using namespace kvpool::ssd;
  std::vector<RecordLoc> out;
  std::vector<uint8_t> sbb = ReadAt(data_path, 0, sizeof(Superblock));
  if (sbb.size() != sizeof(Superblock)) return out;
  Superblock sb;
  std::memcpy(&sb, sbb.data(), sizeof(sb));
  if (sb.magic != kSuperblockMagic || sb.crc != TrailerCrc(sb)) return out;
  const uint32_t incarnation = static_cast<uint32_t>(sb.uuid_lo);
  for (uint64_t ri = 0; ri < sb.region_count; ++ri) {
    const uint64_t base = kSuperblockBytes + ri * sb.region_bytes;
    std::vector<uint8_t> reg = ReadAt(data_path, base, sb.region_bytes);
    if (reg.size() < sizeof(RegionHeader)) continue;
    RegionHeader rh;
    std::memcpy(&rh, reg.data(), sizeof(rh));
    if (rh.magic != kRegionMagic || rh.crc != TrailerCrc(rh) || rh.file_offset != base ||
        rh.uuid_hi != sb.uuid_hi || rh.uuid_lo != sb.uuid_lo) {
      continue;
    }
    // As the engine's scan: a slot that is not a valid header is skipped and
    // the search goes on at the next 64 B boundary.
    uint64_t pos = kRegionHeaderBytes;
    while (pos + kRecordHeaderBytes <= reg.size()) {
      RecordHeader h;
      std::memcpy(&h, reg.data() + pos, sizeof(h));
      RecordExpect at{base + pos, rh.seq, incarnation};
      if (!HeaderValidAt(h, at) || pos + kRecordHeaderBytes + h.value_len > reg.size()) {
        pos += kRecordAlign;
        continue;
      }
      RecordLoc r;
      r.offset = base + pos;
      r.value_len = h.value_len;
      r.key_hi = h.key_hi;
      r.key_lo = h.key_lo;
      r.region_seq = rh.seq;
      r.payload_ok = PayloadValid(h, reg.data() + pos + kRecordHeaderBytes);
      out.push_back(r);
      pos += RecordBytes(h.value_len);
    }
  }
  return out;
}

namespace {
constexpr const char* kNrHugePages = "/proc/sys/vm/nr_hugepages";

long ReadLong(const char* path, const std::string& field = "") {
  std::ifstream f(path);
  std::string line;
  if (field.empty()) return std::getline(f, line) ? std::atol(line.c_str()) : -1;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}

bool WriteLong(const char* path, long v) {
  std::ofstream f(path);
  f << v << "\n";
  f.close();
  return f.good();
}
}  // namespace

HugePageReserve::HugePageReserve(int pages) {
  before_ = ReadLong(kNrHugePages);
  if (before_ < 0) {
    why_ = "no /proc/sys/vm/nr_hugepages";
    return;
  }
  if (!WriteLong(kNrHugePages, before_ + pages)) {
    why_ = "cannot raise vm.nr_hugepages (not root?)";
    before_ = -1;
    return;
  }
  const long free = ReadLong("/proc/meminfo", "HugePages_Free");
  if (free < pages) why_ = "only " + std::to_string(free) + " huge pages free after reserving";
}

HugePageReserve::~HugePageReserve() {
  if (before_ >= 0) WriteLong(kNrHugePages, before_);
}

}  // namespace kvpool::testing
