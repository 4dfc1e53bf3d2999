// kvpool-memcpy-bench: the physical-limit baseline for kvpool's data path.
//
// One thread copies blocks in random order from a source region into random
// blocks of a separate destination region of the same size. Both regions are
// at least 1 GiB and pre-touched before timing, so the copy streams from and
// to DRAM: a hot 1 MiB buffer copied over and over would measure the CPU
// caches, not memory. A kvpool get or put moves each value with exactly one
// such copy (segment <-> caller buffer), so this is the rate it cannot beat.
//
// Output: one line per (block size, repetition); --json makes each a JSON
// object with the same field names kvpool-bench uses.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/settings.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

using kvpool::SettingsTable;

std::string FormatBytes(uint64_t v) { return SettingsTable::FormatBytes(v); }

// Prints a parser's message (it names the flag) and returns the usage exit.
int FlagError(const kvpool::Status& st) {
  std::fprintf(stderr, "kvpool-memcpy-bench: %.*s\n", static_cast<int>(st.message().size()),
               st.message().data());
  return 2;
}

// splitmix64: fast, good enough to pick blocks uniformly.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>((static_cast<__uint128_t>(Next()) * n) >> 64); }
};

// An anonymous mapping, touched with `fill` so no page fault lands in the
// timed loop (on these VMs a first touch costs ~14 us per 4 KiB page).
class Region {
 public:
  Region(uint64_t bytes, bool huge_pages, int fill) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "kvpool-memcpy-bench: mmap of %s failed: %s\n", FormatBytes(bytes).c_str(),
                   std::strerror(errno));
      std::exit(1);
    }
    if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);  // best effort
    std::memset(p, fill, bytes);
    base_ = static_cast<uint8_t*>(p);
  }
  ~Region() { munmap(base_, bytes_); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  uint8_t* base() const { return base_; }

 private:
  uint8_t* base_ = nullptr;
  uint64_t bytes_;
};

double PercentileUs(std::vector<uint64_t>& ns, double q) {
  if (ns.empty()) return 0;
  size_t k = std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())));
  std::nth_element(ns.begin(), ns.begin() + static_cast<ptrdiff_t>(k), ns.end());
  return static_cast<double>(ns[k]) / 1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvpool-memcpy-bench: single-thread memcpy of random blocks between two pre-touched "
               "regions of >= 1 GiB each (the DRAM bandwidth baseline for kvpool-bench)"};
  std::string block_text = "1MiB";
  std::string working_set_text = "1GiB";
  std::string duration_text = "3s";
  int repeat = 1;
  bool json = false;
  bool huge_pages = true;
  uint64_t seed = 1;
  app.add_option("--block-size", block_text,
                 "Bytes per copy; a comma-separated list runs each size (e.g. 64KiB,1MiB,4MiB)")
      ->capture_default_str();
  app.add_option("--working-set", working_set_text, "Size of each of the two regions (>= 1GiB)")
      ->capture_default_str();
  app.add_option("--duration", duration_text, "Timed length of each run (e.g. 3s, 500ms; a bare number is milliseconds)")
      ->capture_default_str();
  app.add_option("--repeat", repeat, "Runs per block size")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_flag("--json", json, "One JSON object per result line");
  app.add_flag("--huge-pages,!--no-huge-pages", huge_pages,
               "madvise(MADV_HUGEPAGE) the regions (default on; kvpool-bench does the same)");
  app.add_option("--seed", seed, "Random seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<uint64_t> blocks;
  {
    std::string_view rest = block_text;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      kvpool::Result<uint64_t> b = SettingsTable::ParseSize("block-size", item);
      if (!b.ok()) return FlagError(b.status());
      if (*b == 0) {
        std::fprintf(stderr, "kvpool-memcpy-bench: --block-size must be > 0\n");
        return 2;
      }
      blocks.push_back(*b);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  // The node's parsers: a value means the same as in kvpool-node's flags (a
  // bare duration is milliseconds).
  kvpool::Result<uint64_t> working_set_parsed = SettingsTable::ParseSize("working-set", working_set_text);
  if (!working_set_parsed.ok()) return FlagError(working_set_parsed.status());
  const uint64_t working_set = *working_set_parsed;
  kvpool::Result<std::chrono::milliseconds> duration = SettingsTable::ParseDuration("duration", duration_text);
  if (!duration.ok()) return FlagError(duration.status());
  const int64_t duration_ms = duration->count();
  if (duration_ms <= 0) {
    std::fprintf(stderr, "kvpool-memcpy-bench: --duration must be > 0\n");
    return 2;
  }
  if (blocks.empty()) {
    std::fprintf(stderr, "kvpool-memcpy-bench: --block-size: empty\n");
    return 2;
  }
  if (working_set < (1ull << 30)) {
    std::fprintf(stderr,
                 "kvpool-memcpy-bench: warning: working set %s < 1GiB may fit in caches and "
                 "overstate memory bandwidth\n",
                 FormatBytes(working_set).c_str());
  }
  for (uint64_t b : blocks) {
    if (b > working_set / 2) {
      std::fprintf(stderr, "kvpool-memcpy-bench: block %s needs a working set of at least twice that\n",
                   FormatBytes(b).c_str());
      return 2;
    }
  }

  Region src(working_set, huge_pages, 0x5a);
  Region dst(working_set, huge_pages, 0);
  Rng rng{seed};

  for (uint64_t block : blocks) {
    const uint64_t nblocks = working_set / block;
    for (int rep = 0; rep < repeat; ++rep) {
      std::vector<uint64_t> lat_ns;
      lat_ns.reserve(1 << 16);
      uint64_t copies = 0;
      const auto start = SteadyClock::now();
      const auto end = start + std::chrono::milliseconds(duration_ms);
      auto now = start;
      while (now < end) {
        const uint8_t* from = src.base() + rng.Below(nblocks) * block;
        uint8_t* to = dst.base() + rng.Below(nblocks) * block;
        const auto t0 = now;
        std::memcpy(to, from, block);
        now = SteadyClock::now();
        lat_ns.push_back(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count()));
        ++copies;
      }
      // Keep the copies observable so nothing can be elided.
      asm volatile("" : : "r"(dst.base()) : "memory");
      const double secs = std::chrono::duration<double>(now - start).count();
      const double bytes_per_s = static_cast<double>(copies * block) / secs;
      const double p50 = PercentileUs(lat_ns, 0.50);
      const double p99 = PercentileUs(lat_ns, 0.99);
      const double p999 = PercentileUs(lat_ns, 0.999);
      if (json) {
        nlohmann::ordered_json j = {{"op", "memcpy"},
                            {"block_size", block},
                            {"value_size", block},
                            {"working_set", working_set},
                            {"threads", 1},
                            {"rep", rep},
                            {"huge_pages", huge_pages},
                            {"duration_s", secs},
                            {"ops", copies},
                            {"ops_per_s", static_cast<double>(copies) / secs},
                            {"bytes_per_s", bytes_per_s},
                            {"gbps", bytes_per_s / 1e9},
                            {"p50_us", p50},
                            {"p99_us", p99},
                            {"p999_us", p999}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("memcpy block=%s working-set=2x%s: %.2f GB/s, %.0f copies/s, p50 %.1fus p99 %.1fus "
                    "p99.9 %.1fus [%.2fs]\n",
                    FormatBytes(block).c_str(), FormatBytes(working_set).c_str(), bytes_per_s / 1e9,
                    static_cast<double>(copies) / secs, p50, p99, p999, secs);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
