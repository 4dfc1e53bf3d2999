// dram_trace_bench: replays a synthetic LLM-prefix trace against DramStore
// with each eviction policy at the same capacity and prints the hit ratios
// and the time per access (the store alone: metadata, lock and policy).
//
// The trace: requests pick a prompt prefix from a Zipf distribution and read
// its pages in order (a miss puts the page, as an engine would after
// computing it). Every `scan_every` requests a one-time scan (a batch job, a
// long document read once) puts `scan_factor` x the cache's entries of
// never-seen pages. Only metadata is exercised (no bytes are copied).
//
// With mix_kib, odd prefixes use pages of mix_kib instead of value_kib (two
// size classes sharing the memory); with scan_kib, scans write values of that
// size (a write-only flood of another class).
//
// Usage: dram_trace_bench [requests] [prefixes] [pages_per_prefix] [zipf_alpha]
//                         [scan_every] [scan_factor] [capacity_mib] [value_kib]
//                         [mix_kib] [scan_kib]
// Environment: POLICIES, names of kEvictionPolicies separated by spaces
// (default: every one), run in the order of kEvictionPolicies.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "store/dram/dram_store.h"

namespace {

using kvpool::DramOptions;
using kvpool::DramStore;
using kvpool::KeyId;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
KeyId PageKey(uint64_t prefix, uint64_t page) {
  const uint64_t id = prefix * 4096 + page;
  return KeyId{Mix(id * 2 + 1), Mix(id * 2 + 2)};
}

struct Trace {
  uint64_t requests = 200000;
  uint64_t prefixes = 5000;
  uint64_t pages = 8;
  double alpha = 0.9;
  uint64_t scan_every = 20000;
  double scan_factor = 1.5;
  uint64_t capacity_mib = 256;
  uint64_t value_kib = 64;
  uint64_t mix_kib = 0;   // 0: value_kib
  uint64_t scan_kib = 0;  // 0: value_kib
};

struct Result {
  uint64_t hot_accesses = 0, hot_hits = 0, scan_accesses = 0, scan_hits = 0;
  uint64_t evictions = 0, slab_moves = 0;
  double ns_per_access = 0;
};

Result Replay(const Trace& t, const char* policy) {
  DramOptions o;
  o.capacity_bytes = t.capacity_mib << 20;
  o.prefault = false;  // metadata only
  o.huge_pages = false;
  o.eviction = policy;
  auto opened = DramStore::Open(o, nullptr);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    std::exit(1);
  }
  std::unique_ptr<DramStore> store = std::move(opened).value();
  const uint64_t value = t.value_kib << 10;
  const uint64_t mix_value = (t.mix_kib == 0 ? t.value_kib : t.mix_kib) << 10;
  const uint64_t scan_value = (t.scan_kib == 0 ? t.value_kib : t.scan_kib) << 10;
  const uint64_t scan_entries = o.capacity_bytes / scan_value;

  std::vector<double> cdf(t.prefixes);
  double sum = 0;
  for (uint64_t i = 0; i < t.prefixes; ++i) {
    sum += 1.0 / std::pow(static_cast<double>(i + 1), t.alpha);
    cdf[i] = sum;
  }
  std::mt19937_64 rng(12345);  // same trace for every policy
  std::uniform_real_distribution<double> u(0, sum);

  Result r;
  const auto started = std::chrono::steady_clock::now();
  uint64_t scan_id = 1ull << 40;
  auto access = [&](const KeyId& key, uint64_t size, bool scan) {
    (scan ? r.scan_accesses : r.hot_accesses)++;
    if (store->Acquire(key).ok()) {
      (scan ? r.scan_hits : r.hot_hits)++;
      return;
    }
    auto res = store->Reserve(key, size);
    if (res.ok()) (void)store->Commit(std::move(res).value());
  };
  for (uint64_t req = 0; req < t.requests; ++req) {
    const uint64_t prefix = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
    const uint64_t size = prefix % 2 == 1 ? mix_value : value;
    for (uint64_t p = 0; p < t.pages; ++p) access(PageKey(prefix, p), size, false);
    if (t.scan_every > 0 && (req + 1) % t.scan_every == 0) {
      const uint64_t n = static_cast<uint64_t>(t.scan_factor * static_cast<double>(scan_entries));
      for (uint64_t i = 0; i < n; ++i) access(PageKey(scan_id++, 0), scan_value, true);
    }
  }
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - started;
  r.ns_per_access = took.count() / static_cast<double>(r.hot_accesses + r.scan_accesses);
  const kvpool::DramStats s = store->GetStats();
  r.evictions = s.evictions;
  r.slab_moves = s.slab_moves;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Trace t;
  if (argc > 1) t.requests = std::strtoull(argv[1], nullptr, 10);
  if (argc > 2) t.prefixes = std::strtoull(argv[2], nullptr, 10);
  if (argc > 3) t.pages = std::strtoull(argv[3], nullptr, 10);
  if (argc > 4) t.alpha = std::strtod(argv[4], nullptr);
  if (argc > 5) t.scan_every = std::strtoull(argv[5], nullptr, 10);
  if (argc > 6) t.scan_factor = std::strtod(argv[6], nullptr);
  if (argc > 7) t.capacity_mib = std::strtoull(argv[7], nullptr, 10);
  if (argc > 8) t.value_kib = std::strtoull(argv[8], nullptr, 10);
  if (argc > 9) t.mix_kib = std::strtoull(argv[9], nullptr, 10);
  if (argc > 10) t.scan_kib = std::strtoull(argv[10], nullptr, 10);
  const uint64_t entries = (t.capacity_mib << 10) / t.value_kib;
  std::printf(
      "trace: %llu requests x %llu pages, %llu prefixes (%llu pages, %.1fx the cache), zipf %.2f,"
      " scan of %.1fx the cache every %llu requests; cache %llu MiB = %llu x %llu KiB\n",
      (unsigned long long)t.requests, (unsigned long long)t.pages,
      (unsigned long long)t.prefixes, (unsigned long long)(t.prefixes * t.pages),
      static_cast<double>(t.prefixes * t.pages) / static_cast<double>(entries), t.alpha,
      t.scan_factor, (unsigned long long)t.scan_every, (unsigned long long)t.capacity_mib,
      (unsigned long long)entries, (unsigned long long)t.value_kib);
  if (t.mix_kib != 0) {
    std::printf("  odd prefixes: %llu KiB pages\n", (unsigned long long)t.mix_kib);
  }
  if (t.scan_kib != 0) {
    std::printf("  scans: %llu KiB values\n", (unsigned long long)t.scan_kib);
  }
  // POLICIES (environment, names separated by spaces): only those.
  const char* only = std::getenv("POLICIES");
  for (std::string_view name : kvpool::kEvictionPolicies) {
    const std::string policy(name);
    if (only != nullptr &&
        (" " + std::string(only) + " ").find(" " + policy + " ") == std::string::npos) {
      continue;
    }
    const Result r = Replay(t, policy.c_str());
    const uint64_t all = r.hot_accesses + r.scan_accesses;
    std::printf(
        "%-7s hit ratio %.4f (prefix pages %.4f, scans %.4f)  evictions %llu  slab moves %llu  "
        "%.0f ns/access\n",
        policy.c_str(), static_cast<double>(r.hot_hits + r.scan_hits) / static_cast<double>(all),
        static_cast<double>(r.hot_hits) / static_cast<double>(r.hot_accesses),
        r.scan_accesses == 0
            ? 0.0
            : static_cast<double>(r.scan_hits) / static_cast<double>(r.scan_accesses),
        (unsigned long long)r.evictions, (unsigned long long)r.slab_moves, r.ns_per_access);
  }
  return 0;
}
