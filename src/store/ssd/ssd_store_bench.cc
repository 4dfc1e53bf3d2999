// ssd_store_bench: throughput of the SSD tier on real files, for comparing
// with fio (O_DIRECT, 1 MiB, io_uring) on the same directory.
//
//   ssd_store_bench --dir /path[,/path2] [--gib 4] [--value-kib 1024]
//                   [--region-mib 16] [--threads 4] [--pread]
//                   [--flush-threads 4] [--buffers 4]
//
// Writes gib GiB of values (demotion-style: Insert, retried while every
// region buffer is busy), flushes, reads every value back (O_DIRECT, so
// from the device), then times a restart from the checkpoint and a restart
// by scan. Prints one "name value unit" line per figure.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/executor.h"
#include "common/key_id.h"
#include "common/log.h"
#include "store/ssd/file_device.h"
#include "store/ssd/ssd_store.h"

namespace kvpool {
namespace {

using SteadyClock = std::chrono::steady_clock;
double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

KeyId BenchKey(uint64_t i) { return KeyId{0x9E3779B97F4A7C15ull * (i + 1), i}; }

int Main(int argc, char** argv) {
  std::string dirs_arg;
  double gib = 4;
  uint64_t value_kib = 1024, region_mib = 16;
  int threads = 4, flush_threads = 4;
  uint32_t buffers = 4;
  bool pread = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir") dirs_arg = next();
    else if (a == "--gib") gib = std::atof(next().c_str());
    else if (a == "--value-kib") value_kib = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--region-mib") region_mib = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--pread") pread = true;
    else if (a == "--flush-threads") flush_threads = std::atoi(next().c_str());
    else if (a == "--buffers") buffers = static_cast<uint32_t>(std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (dirs_arg.empty()) {
    std::fprintf(stderr, "usage: ssd_store_bench --dir DIR[,DIR] [--gib N] [--value-kib K] "
                         "[--region-mib M] [--threads T] [--pread]\n");
    return 2;
  }
  SetLogLevel(LogLevel::kWarn);
  SsdOptions o;
  for (size_t p = 0; p <= dirs_arg.size();) {
    size_t c = dirs_arg.find(',', p);
    if (c == std::string::npos) c = dirs_arg.size();
    o.dirs.push_back(dirs_arg.substr(p, c - p) + "/ssd_store_bench");
    p = c + 1;
  }
  for (auto& d : o.dirs) std::filesystem::remove_all(d);
  const uint64_t value = value_kib << 10;
  const uint64_t n = static_cast<uint64_t>(gib * (1ull << 30)) / value;
  o.region_bytes = region_mib << 20;
  o.buffers_per_dir = buffers;
  // Room for every value plus slack regions per directory: nothing evicted.
  o.capacity_bytes = static_cast<uint64_t>(n * (value + 4096) * 1.1) +
                     o.dirs.size() * (4 + o.buffers_per_dir) * o.region_bytes;
  o.max_value_bytes = value;
  FileDeviceOptions fo;
  fo.use_io_uring = !pread;
  o.device_factory = FileDeviceFactory(fo);
  ThreadPool pool(flush_threads, "ssd-bench");

  auto s = SsdStore::Open(o, nullptr, &pool);
  if (!s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.status().ToString().c_str());
    return 1;
  }
  std::printf("device %s\n", (*s)->GetStats().dirs[0].device_kind.c_str());
  std::printf("values %llu x %llu bytes, %d threads, region %llu MiB, %zu dirs\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(value), threads,
              static_cast<unsigned long long>(region_mib), o.dirs.size());
  std::vector<uint8_t> src(value);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 17);

  std::atomic<uint64_t> next{0}, retries{0};
  auto t0 = SteadyClock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      std::vector<uint8_t> v = src;
      for (uint64_t i; (i = next.fetch_add(1)) < n;) {
        std::memcpy(v.data(), &i, sizeof(i));
        while (!(*s)->Insert(BenchKey(i), v.data(), v.size())) {
          retries.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  if (!(*s)->Flush().ok()) return 1;
  double w = Since(t0);
  const double bytes = static_cast<double>(n) * value;
  std::printf("write_gbps %.3f GB/s (%.2f s, %llu retries while buffers were busy)\n",
              bytes / w / 1e9, w, static_cast<unsigned long long>(retries.load()));

  next = 0;
  std::atomic<uint64_t> bad{0};
  ts.clear();
  t0 = SteadyClock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      std::vector<uint8_t> v(value);
      for (uint64_t i; (i = next.fetch_add(1)) < n;) {
        uint64_t stamp = 0;
        if (!(*s)->Read(BenchKey(i), v.data(), v.size()).ok()) {
          bad.fetch_add(1);
          continue;
        }
        std::memcpy(&stamp, v.data(), sizeof(stamp));
        if (stamp != i) bad.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  double r = Since(t0);
  std::printf("read_gbps %.3f GB/s (%.2f s, %llu failed)\n", bytes / r / 1e9, r,
              static_cast<unsigned long long>(bad.load()));
  SsdStats st = (*s)->GetStats();
  std::printf("index_bytes_per_entry %.1f B (index_bytes %llu, entries %llu)\n",
              st.index_bytes_per_entry, static_cast<unsigned long long>(st.index_bytes),
              static_cast<unsigned long long>(st.entries));

  t0 = SteadyClock::now();
  if (!(*s)->Close().ok()) return 1;
  std::printf("close_s %.3f s\n", Since(t0));
  s->reset();
  const double data_gib = bytes / (1ull << 30);
  t0 = SteadyClock::now();
  s = SsdStore::Open(o, nullptr, &pool);
  double c = Since(t0);
  if (!s.ok()) return 1;
  std::printf("checkpoint_load %.3f s/GiB (%.3f s, recovery=%s, entries %llu)\n", c / data_gib, c,
              (*s)->GetStats().recovery.c_str(),
              static_cast<unsigned long long>((*s)->GetStats().entries));
  s->reset();  // dropped without Close: the next start scans
  t0 = SteadyClock::now();
  s = SsdStore::Open(o, nullptr, &pool);
  double sc = Since(t0);
  if (!s.ok()) return 1;
  std::printf("scan_recovery %.3f s/GiB (%.3f s, recovery=%s, entries %llu)\n", sc / data_gib, sc,
              (*s)->GetStats().recovery.c_str(),
              static_cast<unsigned long long>((*s)->GetStats().entries));
  s->reset();
  for (auto& d : o.dirs) std::filesystem::remove_all(d);
  return bad.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvpool

int main(int argc, char** argv) { return kvpool::Main(argc, argv); }
