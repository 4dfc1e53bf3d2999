// dram_trace_replay: replays a request trace in the Mooncake format (one
// JSON object a line, its "hash_ids" the request's block chain) through
// DramStore alone, with the calls a node makes for `kvpool-bench --trace`:
// an exists of the chain (Contains, not an access), one batch read of its
// leading run of hits (AcquireBatch), and the blocks after it that are not
// held written as one chain (all reserved, then committed in order, with the
// read's run: DramStore::ChainPlace::run). Prints, per eviction policy, the
// block hit ratio (blocks read in the leading runs over all block
// references) and the time per block reference.
//
// It takes seconds where bench/compare.sh trace takes minutes, for trying a
// policy's variants across the traffic shapes. Blocks are named as
// kvpool-bench names them ("b<id>" in namespace kvpool-trace), so sampled
// shadow caches sample the same keys as on a node; the sweep on real nodes
// is what judges.
//
// Usage: dram_trace_replay TRACE PERCENT [VALUE_BYTES]
//   PERCENT      the DRAM capacity, in % of the trace's distinct blocks
//   VALUE_BYTES  the value size; default 16 KiB doubled until 2 % of the
//                distinct blocks fill 16 MiB (as bench/trace_common.sh sizes
//                a trace's values); only entry counts decide hit ratios
// Environment: POLICIES, names of kEvictionPolicies separated by spaces
// (default "prefix lru").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/key_id.h"
#include "store/dram/dram_store.h"

namespace {

using kvpool::DramOptions;
using kvpool::DramStore;
using kvpool::KeyId;

struct Result {
  double hit_ratio = 0;
  double ns_per_ref = 0;
  double share = 0;
  uint64_t share_changes = 0;
  bool bimodal = false;  // the chosen candidate inserts bimodally
};

// A request: its blocks' keys, named as kvpool-bench --trace names them.
using Request = std::vector<KeyId>;

Result Replay(const std::vector<Request>& trace, uint64_t capacity_bytes, uint64_t value_bytes,
              const std::string& policy) {
  DramOptions o;
  o.capacity_bytes = capacity_bytes;
  o.slab_bytes = 1 << 20;
  o.prefault = false;  // metadata only
  o.huge_pages = false;
  o.eviction = policy;
  // As a node sizes its read room (--dram-read-room, at most an eighth).
  const uint64_t room = std::min<uint64_t>(64ull << 20, capacity_bytes / 8);
  o.read_room_bytes = (room + o.slab_bytes - 1) / o.slab_bytes * o.slab_bytes;
  o.max_value_bytes = std::min(o.max_value_bytes, capacity_bytes);
  auto opened = DramStore::Open(o, nullptr);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    std::exit(1);
  }
  std::unique_ptr<DramStore> store = std::move(opened).value();
  uint64_t refs = 0, hits = 0;
  std::vector<bool> held;
  std::vector<DramStore::Pin> pins;
  std::vector<DramStore::Reservation> writes;
  const auto started = std::chrono::steady_clock::now();
  for (const Request& keys : trace) {
    const size_t n = keys.size();
    held.assign(n, false);
    size_t prefix = 0;
    for (size_t i = 0; i < n; ++i) {
      held[i] = store->Contains(keys[i]);
      if (held[i] && prefix == i) ++prefix;
    }
    size_t got = 0;
    uint8_t run = UINT8_MAX;
    if (prefix > 0) {
      pins.clear();
      pins.resize(prefix);
      store->AcquireBatch(std::span<const KeyId>(keys.data(), prefix), pins, &run);
      while (got < prefix && pins[got].valid()) ++got;
      pins.clear();
    }
    refs += n;
    hits += got;
    writes.clear();
    for (size_t i = got; i < n; ++i) {
      if (i >= prefix && held[i]) continue;  // cached behind the first miss
      auto r = store->Reserve(keys[i], value_bytes);
      if (r.ok()) writes.push_back(std::move(r).value());
    }
    DramStore::ChainPlace chain;
    chain.run = run;
    for (auto& w : writes) (void)store->Commit(std::move(w), &chain);
  }
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - started;
  Result r;
  r.hit_ratio = refs == 0 ? 0 : static_cast<double>(hits) / static_cast<double>(refs);
  r.ns_per_ref = refs == 0 ? 0 : took.count() / static_cast<double>(refs);
  const kvpool::DramStats s = store->GetStats();
  r.share = s.eviction.protected_share;
  r.share_changes = s.eviction.share_changes;
  r.bimodal = s.eviction.bimodal;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: dram_trace_replay TRACE PERCENT [VALUE_BYTES]\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", argv[1]);
    return 1;
  }
  const double percent = std::strtod(argv[2], nullptr);
  if (!(percent > 0 && percent <= 100)) {
    std::fprintf(stderr, "PERCENT must be in (0, 100]: %s\n", argv[2]);
    return 2;
  }
  std::vector<Request> trace;
  std::vector<uint64_t> distinct;
  std::string line;
  for (size_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::vector<uint64_t> blocks;
    try {
      blocks = nlohmann::json::parse(line).at("hash_ids").get<std::vector<uint64_t>>();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s:%zu: %s\n", argv[1], no, e.what());
      return 1;
    }
    Request& keys = trace.emplace_back();
    for (uint64_t b : blocks)
      keys.push_back(kvpool::MakeKeyId("kvpool-trace", "b" + std::to_string(b)));
    distinct.insert(distinct.end(), blocks.begin(), blocks.end());
  }
  std::sort(distinct.begin(), distinct.end());
  const uint64_t d = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
  uint64_t value = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
  if (value == 0) {
    value = 16 << 10;
    while (static_cast<double>(d) * 0.02 * static_cast<double>(value) < (16 << 20)) value *= 2;
  }
  const uint64_t mib = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(static_cast<double>(d) * percent / 100 *
                                         static_cast<double>(value) / (1 << 20))));
  std::printf("trace: %zu requests, %llu distinct blocks; cache %llu MiB of %llu-byte values\n",
              trace.size(), (unsigned long long)d, (unsigned long long)mib,
              (unsigned long long)value);
  const char* env = std::getenv("POLICIES");
  std::istringstream names(env != nullptr ? env : "prefix lru");
  for (std::string policy; names >> policy;) {
    const Result r = Replay(trace, mib << 20, value, policy);
    std::printf("%-12s hit ratio %.4f  %.0f ns/ref  share %.1f%s (%llu changes)\n", policy.c_str(),
                r.hit_ratio, r.ns_per_ref, r.share, r.bimodal ? " bimodal" : "",
                (unsigned long long)r.share_changes);
  }
  return 0;
}
