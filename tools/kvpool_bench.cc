// kvpool-bench: load generator for a local kvpool-node, over the public C ABI
// only (include/kvpool/kvpool.h), the way an inference engine uses it.
//
// Each thread owns one kvpool_client and issues batch calls back to back for
// --duration. Per call it formats the keys "bench-<i>" and hashes them with
// kvpool_key_ids (engines hash per call, so that cost is in the numbers),
// then runs the op:
//   put     kvpool_put from random value-sized blocks of a pre-touched source
//           region (1 GiB, or the working set if smaller) to fresh keys
//   get     kvpool_get of a random run of `batch` consecutive keys of the
//           working set into random blocks of a pre-touched 1 GiB destination
//   exists  kvpool_exists of a random run of keys (no bytes move)
//   zc-get  kvpool_acquire, copy each value out to a destination block (what a
//           DMA to the GPU would do; --zc-read touch only reads the stamps),
//           kvpool_release
//   zc-put  kvpool_reserve, copy from a source block into the slot,
//           kvpool_commit
// Values are deterministic: the first and last 8 bytes of value i are
// stamps derived from (i, value size). Every get verifies both stamps and the
// size of every item it reads and counts a mismatch as an error.
// Puts always write keys no one wrote before in this namespace (indices from
// --keys upward), since a put of a committed key is a no-op; a put that still
// finds its key present (a rerun in the same namespace) is counted in
// "existed" and its bytes are not counted.
//
// --trace FILE replays an LLM request trace instead (tools/trace_replay.h):
// per request a hit-prefix, reads of the hit blocks and writes of the rest,
// against one or more nodes (--sockets), with offline LRU and Belady figures.
//
// Output: one line per (op, repetition), human-readable or --json.
// Exit status: 0 ok, 1 setup failure (no node, ...), 2 usage, 3 ran but
// counted errors (failed items or corrupt bytes).
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/settings.h"
#include "kvpool/kvpool.h"
#include "tools/trace_replay.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMaxDefaultKeys = 1ull << 20;
constexpr size_t kKeyStride = 32;  // "bench-" + up to 20 digits fits
constexpr int kStatusSlots = 13;   // 0..11 known codes, 12 = anything else
constexpr int kMaxConsecutiveFailedCalls = 200;

enum class Op { kPut, kGet, kExists, kZcGet, kZcPut };
enum class ZcRead { kCopy, kTouch };

const char* OpName(Op op) {
  switch (op) {
    case Op::kPut: return "put";
    case Op::kGet: return "get";
    case Op::kExists: return "exists";
    case Op::kZcGet: return "zc-get";
    case Op::kZcPut: return "zc-put";
  }
  return "?";
}

bool ParseOp(std::string_view s, Op* op) {
  for (Op o : {Op::kPut, Op::kGet, Op::kExists, Op::kZcGet, Op::kZcPut}) {
    if (s == OpName(o)) {
      *op = o;
      return true;
    }
  }
  return false;
}

bool IsWrite(Op op) { return op == Op::kPut || op == Op::kZcPut; }

using kvpool::Result;
using kvpool::SettingsTable;

std::string FormatBytes(uint64_t v) { return SettingsTable::FormatBytes(v); }

// Stores a flag's parsed value, or prints the parser's message (which names
// the flag) and returns false.
template <typename T, typename Out>
bool TakeFlag(const Result<T>& parsed, Out* out) {
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvpool-bench: %.*s\n", static_cast<int>(parsed.status().message().size()),
                 parsed.status().message().data());
    return false;
  }
  if constexpr (std::is_same_v<T, std::chrono::milliseconds>) *out = parsed->count();
  else *out = *parsed;
  return true;
}

std::string FormatUs(double us) {
  char buf[32];
  if (us >= 1000) std::snprintf(buf, sizeof buf, "%.2fms", us / 1000);
  else std::snprintf(buf, sizeof buf, "%.1fus", us);
  return buf;
}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64.
struct Rng {
  uint64_t s;
  uint64_t Next() { return Mix64(s += 0x9e3779b97f4a7c15ull); }
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>((static_cast<__uint128_t>(Next()) * n) >> 64); }
};

// The stamps of value `index`: its first and last 8 bytes.
uint64_t HeadStamp(uint64_t index, uint64_t size) { return Mix64(index * 2 + 1) ^ size; }
uint64_t TailStamp(uint64_t index, uint64_t size) { return Mix64(index * 2 + 2) ^ (size << 1); }

void WriteStamps(uint8_t* value, uint64_t index, uint64_t size) {
  const uint64_t head = HeadStamp(index, size), tail = TailStamp(index, size);
  std::memcpy(value, &head, 8);
  std::memcpy(value + size - 8, &tail, 8);
}

bool CheckStamps(const uint8_t* value, uint64_t index, uint64_t size) {
  uint64_t head, tail;
  std::memcpy(&head, value, 8);
  std::memcpy(&tail, value + size - 8, 8);
  return head == HeadStamp(index, size) && tail == TailStamp(index, size);
}

// An anonymous mapping, touched before timing so no page fault lands in the
// timed loop (on these VMs a first touch costs ~14 us per 4 KiB page).
class Region {
 public:
  static std::unique_ptr<Region> Make(uint64_t bytes, bool huge_pages, int fill) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "kvpool-bench: mmap of %s failed: %s\n", FormatBytes(bytes).c_str(),
                   std::strerror(errno));
      return nullptr;
    }
    if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);  // best effort
    std::memset(p, fill, bytes);
    return std::unique_ptr<Region>(new Region(static_cast<uint8_t*>(p), bytes));
  }
  ~Region() { munmap(base_, bytes_); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Region(uint8_t* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  uint8_t* base_;
  uint64_t bytes_;
};

struct Config {
  std::string socket;  // empty: libkvpool's default, where the node puts it
  std::vector<Op> ops;
  uint64_t value_size = 1ull << 20;
  size_t batch = 16;
  int threads = 1;
  int64_t duration_ms = 5000;
  int64_t warmup_ms = 200;
  uint64_t keys = 0;  // 0: derived from value_size
  std::string ns = "kvpool-bench";
  bool populate = false;
  bool json = false;
  int repeat = 1;
  uint64_t buffer_bytes = kGiB;
  bool huge_pages = true;
  ZcRead zc_read = ZcRead::kCopy;
  uint32_t timeout_ms = 5000;
  uint64_t seed = 1;
  // put: > 0 describes each key as an engine block of this many tokens
  // (kvpool_put_described; docs/kv-events.md, "Block descriptors").
  uint32_t describe_tokens = 0;
};

// A block descriptor (docs/kv-events.md) of block `idx` of a chain: int
// hash idx, parent idx - 1, `tokens` token ids.
void AppendDescriptor(std::string* out, uint64_t idx, uint32_t tokens) {
  auto u32 = [&](uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); };
  out->push_back(1);  // version
  out->push_back(1);  // hash: uint64
  u64(idx);
  if (idx == 0) {
    out->push_back(0);  // no parent
  } else {
    out->push_back(1);
    u64(idx - 1);
  }
  u32(tokens);  // block size
  u32(tokens);
  for (uint32_t t = 0; t < tokens; ++t) u32(static_cast<uint32_t>(idx * tokens + t));
  u32(0);             // group 0
  out->push_back(0);  // no LoRA
  out->push_back(0);  // no spec kind
}

// What one thread counted in one run (or in the populate phase).
struct Counts {
  uint64_t calls = 0;
  uint64_t items = 0;  // items attempted in measured calls
  uint64_t bytes = 0;  // bytes actually moved (stored or read)
  uint64_t errors = 0;
  uint64_t misses = 0;
  uint64_t mismatches = 0;  // corrupt bytes or wrong size (also in errors)
  uint64_t existed = 0;     // puts of keys already present
  std::array<uint64_t, kStatusSlots> statuses{};  // per item, every outcome
  std::vector<uint64_t> latency_ns;               // per measured call
  SteadyClock::time_point last_end{};
  std::string first_error;

  void Merge(Counts& o) {
    calls += o.calls;
    items += o.items;
    bytes += o.bytes;
    errors += o.errors;
    misses += o.misses;
    mismatches += o.mismatches;
    existed += o.existed;
    for (int i = 0; i < kStatusSlots; ++i) statuses[i] += o.statuses[i];
    latency_ns.insert(latency_ns.end(), o.latency_ns.begin(), o.latency_ns.end());
    last_end = std::max(last_end, o.last_end);
    if (first_error.empty()) first_error = o.first_error;
  }
};

// Per-thread state: the client, scratch arrays for one batch, and this
// thread's share of the source and destination regions. Each of the `batch`
// lanes of a call has its own slice, so the blocks of one call never overlap
// and no two threads ever write the same block.
class Worker {
 public:
  Worker(const Config& cfg, int index, kvpool_client* client, Region* src, Region* dst, uint64_t keys)
      : cfg_(cfg), index_(index), client_(client), keys_(keys), rng_{cfg.seed * 0x1000193 + index},
        next_put_(keys + (static_cast<uint64_t>(index) << 40)) {
    const size_t n = cfg.batch;
    keybuf_.resize(n * kKeyStride);
    keyptrs_.resize(n);
    keylens_.resize(n);
    idx_.resize(n);
    ids_.resize(n);
    ptrs_.resize(n);
    cptrs_.resize(n);
    sizes_.resize(n);
    caps_.assign(n, cfg.value_size);
    statuses_.resize(n);
    statuses2_.resize(n);
    regions_.resize(n);
    handles_.resize(n);
    hits_.resize(n);
    for (size_t k = 0; k < n; ++k) keyptrs_[k] = keybuf_.data() + k * kKeyStride;
    src_ = Slice(src);
    dst_ = Slice(dst);
  }
  ~Worker() { kvpool_close(client_); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Puts keys [lo, hi) of the working set, untimed.
  Counts Populate(uint64_t lo, uint64_t hi) {
    Counts c;
    for (uint64_t i = lo; i < hi; i += cfg_.batch) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(cfg_.batch, hi - i));
      for (size_t k = 0; k < n; ++k) idx_[k] = i + k;
      DoPut(n, c);
    }
    return c;
  }

  // Runs `op` until `end`; calls that start before `measure_from` are warmup.
  Counts Run(Op op, SteadyClock::time_point measure_from, SteadyClock::time_point end) {
    Counts c;
    c.latency_ns.reserve(1 << 16);
    Counts warm;
    const size_t n = cfg_.batch;
    int failed_in_a_row = 0;
    for (auto t0 = SteadyClock::now(); t0 < end; t0 = SteadyClock::now()) {
      const bool measured = t0 >= measure_from;
      Counts& into = measured ? c : warm;
      const uint64_t errors_before = into.errors;
      if (IsWrite(op)) {
        for (size_t k = 0; k < n; ++k) idx_[k] = next_put_++;
      } else {
        const uint64_t start = rng_.Below(keys_);
        for (size_t k = 0; k < n; ++k) idx_[k] = (start + k) % keys_;
      }
      switch (op) {
        case Op::kPut: DoPut(n, into); break;
        case Op::kGet: DoGet(n, into); break;
        case Op::kExists: DoExists(n, into); break;
        case Op::kZcGet: DoZcGet(n, into); break;
        case Op::kZcPut: DoZcPut(n, into); break;
      }
      const auto t1 = SteadyClock::now();
      if (measured) {
        c.latency_ns.push_back(
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
        c.last_end = t1;
      }
      into.calls++;
      into.items += n;
      // A node that went away makes every call fail fast; stop rather than spin.
      failed_in_a_row = into.errors - errors_before == n ? failed_in_a_row + 1 : 0;
      if (failed_in_a_row >= kMaxConsecutiveFailedCalls) {
        std::fprintf(stderr, "kvpool-bench: thread %d: %d calls in a row failed; stopping early\n",
                     index_, failed_in_a_row);
        break;
      }
    }
    if (c.first_error.empty()) c.first_error = warm.first_error;
    c.errors += warm.errors;  // an error is an error, warm or not
    c.mismatches += warm.mismatches;
    return c;
  }

 private:
  struct Lanes {
    uint8_t* base = nullptr;
    uint64_t lane_bytes = 0;
    uint64_t blocks_per_lane = 0;
  };

  Lanes Slice(Region* r) const {
    Lanes l;
    if (r == nullptr) return l;
    const uint64_t per_thread = r->bytes() / static_cast<uint64_t>(cfg_.threads);
    l.base = r->base() + per_thread * static_cast<uint64_t>(index_);
    l.lane_bytes = per_thread / cfg_.batch;
    l.blocks_per_lane = l.lane_bytes / cfg_.value_size;
    return l;
  }

  uint8_t* Block(const Lanes& l, size_t lane) {
    return l.base + lane * l.lane_bytes + rng_.Below(l.blocks_per_lane) * cfg_.value_size;
  }

  void MakeIds(size_t n) {
    for (size_t k = 0; k < n; ++k) {
      char* p = keybuf_.data() + k * kKeyStride;
      std::memcpy(p, "bench-", 6);
      auto r = std::to_chars(p + 6, p + kKeyStride, idx_[k]);
      keylens_[k] = static_cast<size_t>(r.ptr - p);
    }
    kvpool_key_ids(cfg_.ns.data(), cfg_.ns.size(), keyptrs_.data(), keylens_.data(), n, ids_.data());
  }

  // Before a call: statuses the library did not fill take the call's status.
  static constexpr kvpool_status kUnset = -1;
  void ResetStatuses(std::vector<kvpool_status>& s, size_t n) { std::fill_n(s.begin(), n, kUnset); }
  static kvpool_status ItemStatus(kvpool_status item, kvpool_status call) {
    return item == kUnset ? (call == KVPOOL_OK ? KVPOOL_INTERNAL : call) : item;
  }

  void Count(Counts& c, kvpool_status s) {
    c.statuses[(s >= 0 && s < kStatusSlots - 1) ? s : kStatusSlots - 1]++;
  }

  void Error(Counts& c, const char* what, kvpool_status s) {
    c.errors++;
    if (c.first_error.empty()) {
      const char* detail = kvpool_last_error();
      c.first_error = std::string(what) + ": " + kvpool_status_name(s) +
                      (detail != nullptr && *detail != '\0' ? std::string(" (") + detail + ")" : "");
    }
  }

  void Mismatch(Counts& c, const char* what) {
    c.errors++;
    c.mismatches++;
    if (c.first_error.empty()) c.first_error = what;
  }

  void DoPut(size_t n, Counts& c) {
    const uint64_t vs = cfg_.value_size;
    for (size_t k = 0; k < n; ++k) {
      uint8_t* b = Block(src_, k);
      WriteStamps(b, idx_[k], vs);
      cptrs_[k] = b;
      sizes_[k] = vs;
    }
    MakeIds(n);
    ResetStatuses(statuses_, n);
    kvpool_status st;
    if (cfg_.describe_tokens > 0) {
      descbuf_.clear();
      for (size_t k = 0; k < n; ++k) AppendDescriptor(&descbuf_, idx_[k], cfg_.describe_tokens);
      const size_t each = descbuf_.size() / n;  // every descriptor has one size here
      descs_.resize(n);
      for (size_t k = 0; k < n; ++k) descs_[k] = {descbuf_.data() + k * each, each};
      st = kvpool_put_described(client_, ids_.data(), cptrs_.data(), sizes_.data(), descs_.data(),
                                n, statuses_.data());
    } else {
      st = kvpool_put(client_, ids_.data(), cptrs_.data(), sizes_.data(), n, statuses_.data());
    }
    for (size_t k = 0; k < n; ++k) {
      const kvpool_status s = ItemStatus(statuses_[k], st);
      Count(c, s);
      if (s == KVPOOL_OK) c.bytes += vs;
      else if (s == KVPOOL_ALREADY_EXISTS) c.existed++;
      else Error(c, "put", s);
    }
  }

  void DoGet(size_t n, Counts& c) {
    const uint64_t vs = cfg_.value_size;
    for (size_t k = 0; k < n; ++k) ptrs_[k] = Block(dst_, k);
    MakeIds(n);
    ResetStatuses(statuses_, n);
    const kvpool_status st =
        kvpool_get(client_, ids_.data(), ptrs_.data(), caps_.data(), n, sizes_.data(), statuses_.data());
    for (size_t k = 0; k < n; ++k) {
      const kvpool_status s = ItemStatus(statuses_[k], st);
      Count(c, s);
      if (s == KVPOOL_OK) {
        if (sizes_[k] != vs) Mismatch(c, "get: wrong value size");
        else if (!CheckStamps(static_cast<const uint8_t*>(ptrs_[k]), idx_[k], vs)) Mismatch(c, "get: wrong bytes");
        else c.bytes += vs;
      } else if (s == KVPOOL_NOT_FOUND) {
        c.misses++;
      } else {
        Error(c, "get", s);
      }
    }
  }

  void DoExists(size_t n, Counts& c) {
    MakeIds(n);
    size_t prefix = 0;
    const kvpool_status st = kvpool_exists(client_, ids_.data(), n, hits_.data(), &prefix);
    if (st != KVPOOL_OK) {
      for (size_t k = 0; k < n; ++k) {
        Count(c, st);
        Error(c, "exists", st);
      }
      return;
    }
    size_t leading = 0;
    while (leading < n && hits_[leading]) ++leading;
    if (prefix != leading) Mismatch(c, "exists: prefix_len disagrees with hits");
    for (size_t k = 0; k < n; ++k) {
      Count(c, hits_[k] ? KVPOOL_OK : KVPOOL_NOT_FOUND);
      if (!hits_[k]) c.misses++;
    }
  }

  void DoZcGet(size_t n, Counts& c) {
    const uint64_t vs = cfg_.value_size;
    MakeIds(n);
    ResetStatuses(statuses_, n);
    const kvpool_status st = kvpool_acquire(client_, ids_.data(), n, regions_.data(), statuses_.data());
    size_t pinned = 0;
    for (size_t k = 0; k < n; ++k) {
      const kvpool_status s = ItemStatus(statuses_[k], st);
      Count(c, s);
      if (s == KVPOOL_OK) {
        handles_[pinned++] = regions_[k].handle;
        const uint8_t* data = static_cast<const uint8_t*>(regions_[k].data);
        if (regions_[k].size != vs) {
          Mismatch(c, "zc-get: wrong value size");
          continue;
        }
        if (cfg_.zc_read == ZcRead::kCopy) {
          uint8_t* to = Block(dst_, k);
          std::memcpy(to, data, vs);
          data = to;
          c.bytes += vs;
        }
        if (!CheckStamps(data, idx_[k], vs)) Mismatch(c, "zc-get: wrong bytes");
      } else if (s == KVPOOL_NOT_FOUND) {
        c.misses++;
      } else {
        Error(c, "acquire", s);
      }
    }
    if (pinned > 0) {
      const kvpool_status r = kvpool_release(client_, handles_.data(), pinned);
      if (r != KVPOOL_OK) Error(c, "release", r);
    }
  }

  void DoZcPut(size_t n, Counts& c) {
    const uint64_t vs = cfg_.value_size;
    std::fill_n(sizes_.begin(), n, vs);
    MakeIds(n);
    ResetStatuses(statuses_, n);
    const kvpool_status st =
        kvpool_reserve(client_, ids_.data(), sizes_.data(), n, regions_.data(), statuses_.data());
    size_t reserved = 0;
    for (size_t k = 0; k < n; ++k) {
      const kvpool_status s = ItemStatus(statuses_[k], st);
      if (s == KVPOOL_OK) {
        if (regions_[k].size != vs || regions_[k].data == nullptr) {
          Count(c, s);
          Mismatch(c, "reserve: slot of the wrong size");
          kvpool_abort(client_, &regions_[k].handle, 1);
          continue;
        }
        uint8_t* from = Block(src_, k);
        WriteStamps(from, idx_[k], vs);
        std::memcpy(regions_[k].data, from, vs);
        handles_[reserved++] = regions_[k].handle;
      } else {
        Count(c, s);
        if (s == KVPOOL_ALREADY_EXISTS) c.existed++;
        else Error(c, "reserve", s);
      }
    }
    if (reserved == 0) return;
    ResetStatuses(statuses2_, reserved);
    const kvpool_status cst = kvpool_commit(client_, handles_.data(), reserved, statuses2_.data());
    for (size_t j = 0; j < reserved; ++j) {
      const kvpool_status s = ItemStatus(statuses2_[j], cst);
      Count(c, s);
      if (s == KVPOOL_OK) c.bytes += vs;
      else if (s == KVPOOL_ALREADY_EXISTS) c.existed++;
      else Error(c, "commit", s);
    }
  }

  const Config& cfg_;
  const int index_;
  kvpool_client* const client_;
  const uint64_t keys_;
  Rng rng_;
  uint64_t next_put_;  // fresh put keys; threads never overlap (index << 40)
  Lanes src_, dst_;
  std::vector<char> keybuf_;
  std::vector<const void*> keyptrs_;
  std::vector<size_t> keylens_;
  std::vector<uint64_t> idx_;
  std::vector<kvpool_key_id> ids_;
  std::vector<void*> ptrs_;
  std::vector<const void*> cptrs_;
  std::string descbuf_;                  // put --describe: this call's descriptors
  std::vector<kvpool_descriptor> descs_;
  std::vector<uint64_t> sizes_, caps_;
  std::vector<kvpool_status> statuses_, statuses2_;
  std::vector<kvpool_region> regions_;
  std::vector<uint64_t> handles_;
  std::vector<uint8_t> hits_;
};

double PercentileUs(std::vector<uint64_t>& ns, double q) {
  if (ns.empty()) return 0;
  size_t k = std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())));
  std::nth_element(ns.begin(), ns.begin() + static_cast<ptrdiff_t>(k), ns.end());
  return static_cast<double>(ns[k]) / 1000.0;
}

nlohmann::ordered_json StatusCounts(const Counts& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (int i = 0; i < kStatusSlots; ++i) {
    if (c.statuses[i] == 0) continue;
    j[i < kStatusSlots - 1 ? kvpool_status_name(i) : "Other"] = c.statuses[i];
  }
  return j;
}

void Report(const Config& cfg, Op op, int rep, uint64_t keys, SteadyClock::time_point measure_from,
            Counts& c) {
  const double secs =
      c.calls == 0 ? 0 : std::chrono::duration<double>(c.last_end - measure_from).count();
  const double ops_per_s = secs > 0 ? static_cast<double>(c.items) / secs : 0;
  const double bytes_per_s = secs > 0 ? static_cast<double>(c.bytes) / secs : 0;
  const double p50 = PercentileUs(c.latency_ns, 0.50);
  const double p99 = PercentileUs(c.latency_ns, 0.99);
  const double p999 = PercentileUs(c.latency_ns, 0.999);
  if (cfg.json) {
    nlohmann::ordered_json j = {{"op", OpName(op)},
                                {"value_size", cfg.value_size},
                                {"batch", cfg.batch},
                                {"threads", cfg.threads},
                                {"keys", keys},
                                {"namespace", cfg.ns},
                                {"rep", rep},
                                {"duration_s", secs},
                                {"calls", c.calls},
                                {"ops", c.items},
                                {"ops_per_s", ops_per_s},
                                {"bytes_per_s", bytes_per_s},
                                {"gbps", bytes_per_s / 1e9},
                                {"p50_us", p50},
                                {"p99_us", p99},
                                {"p999_us", p999},
                                {"errors", c.errors},
                                {"misses", c.misses},
                                {"mismatches", c.mismatches},
                                {"existed", c.existed},
                                {"statuses", StatusCounts(c)}};
    if (op == Op::kZcGet) j["zc_read"] = cfg.zc_read == ZcRead::kCopy ? "copy" : "touch";
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string extra;
    if (c.existed > 0) extra += ", existed " + std::to_string(c.existed);
    if (c.mismatches > 0) extra += ", CORRUPT " + std::to_string(c.mismatches);
    std::printf("%s value=%s batch=%zu threads=%d keys=%llu: %.2f GB/s, %.0f items/s (%.0f calls/s), "
                "call p50 %s p99 %s p99.9 %s, errors %llu, misses %llu%s [%.2fs]\n",
                OpName(op), FormatBytes(cfg.value_size).c_str(), cfg.batch, cfg.threads,
                static_cast<unsigned long long>(keys), bytes_per_s / 1e9, ops_per_s,
                secs > 0 ? static_cast<double>(c.calls) / secs : 0, FormatUs(p50).c_str(), FormatUs(p99).c_str(),
                FormatUs(p999).c_str(), static_cast<unsigned long long>(c.errors),
                static_cast<unsigned long long>(c.misses), extra.c_str(), secs);
  }
  std::fflush(stdout);
  if (!c.first_error.empty()) {
    std::fprintf(stderr, "kvpool-bench: %s: %llu errors; first: %s\n", OpName(op),
                 static_cast<unsigned long long>(c.errors), c.first_error.c_str());
  }
  if (c.existed > 0 && IsWrite(op)) {
    std::fprintf(stderr,
                 "kvpool-bench: %s: %llu keys were already present (rerun in the same namespace?); "
                 "their bytes are not counted\n",
                 OpName(op), static_cast<unsigned long long>(c.existed));
  }
}

// Runs fn(worker) on one thread per worker and merges what they return.
template <typename Fn>
Counts OnAllThreads(std::vector<std::unique_ptr<Worker>>& workers, Fn fn) {
  std::vector<Counts> per(workers.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < workers.size(); ++t) {
    threads.emplace_back([&, t] { per[t] = fn(*workers[t], t); });
  }
  for (auto& th : threads) th.join();
  Counts total;
  for (auto& c : per) total.Merge(c);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"kvpool-bench: load generator for a local kvpool-node (C ABI, one client per thread)"};
  std::string ops_text = "get";
  std::string value_size_text = "1MiB";
  std::string duration_text = "5s";
  std::string warmup_text = "200ms";
  std::string buffer_text = "1GiB";
  std::string zc_read_text = "copy";
  app.add_option("--socket", cfg.socket,
                 "Unix socket of the node (default: $KVPOOL_SOCKET, else the node's default)");
  app.add_option("--op", ops_text,
                 "put|get|exists|zc-get|zc-put; a comma-separated list runs each in turn, "
                 "--repeat times before the next (an op may appear more than once)")
      ->capture_default_str();
  app.add_option("--value-size", value_size_text, "Bytes per value (64KiB, 1MiB, 4M, ...; >= 16)")
      ->capture_default_str();
  app.add_option("--batch", cfg.batch, "Keys per call")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--threads", cfg.threads, "Threads, each with its own kvpool_client")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--duration", duration_text, "Timed length of each run (5s, 500ms, ...; a bare number is milliseconds, as in kvpool-node)")->capture_default_str();
  app.add_option("--warmup", warmup_text, "Untimed calls before each run (200ms, 1s, ...; a bare number is milliseconds)")->capture_default_str();
  app.add_option("--keys", cfg.keys,
                 "Working set in keys for get/exists/zc-get (default: 1GiB of values, at most 1Mi keys)");
  app.add_option("--namespace", cfg.ns, "Key namespace")->capture_default_str();
  app.add_flag("--populate", cfg.populate, "Before get/exists/zc-get, put the working set (untimed)");
  app.add_option("--repeat", cfg.repeat, "Runs of each op")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_flag("--json", cfg.json, "One JSON object per result line");
  app.add_option("--buffer-size", buffer_text,
                 "Caller buffers per process: source (put) and destination (get) regions, each capped "
                 "at the working set")
      ->capture_default_str();
  app.add_flag("--huge-pages,!--no-huge-pages", cfg.huge_pages,
               "madvise(MADV_HUGEPAGE) the caller buffers (default on, as kvpool-memcpy-bench)");
  app.add_option("--zc-read", zc_read_text,
                 "zc-get: copy (copy each value out, like a DMA to the GPU) or touch (read only the stamps)")
      ->check(CLI::IsMember({"copy", "touch"}))
      ->capture_default_str();
  app.add_option("--timeout-ms", cfg.timeout_ms, "Deadline of each call")->capture_default_str();
  app.add_option("--seed", cfg.seed, "Random seed")->capture_default_str();
  app.add_option("--describe", cfg.describe_tokens,
                 "put: describe each key as an engine block of this many tokens (a block "
                 "descriptor with hash, parent and tokens, as connectors attach; 0: none)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  kvpool::trace::ReplayConfig replay;
  std::string sockets_text;
  app.add_option("--trace", replay.trace_path,
                 "Replay this trace (Mooncake JSONL: timestamp, input_length, output_length, "
                 "hash_ids) instead of --op: hit-prefix, read the hits, write the rest");
  app.add_option("--block-tokens", replay.block_tokens, "--trace: tokens per block")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--sockets", sockets_text,
                 "--trace: comma-separated node sockets to route requests to (default: --socket)");
  app.add_option("--route", replay.route, "--trace: round-robin, random or affinity (by first block)")
      ->check(CLI::IsMember({"round-robin", "random", "affinity"}))
      ->capture_default_str();
  app.add_option("--speed", replay.speed,
                 "--trace: 0 replays as fast as possible; S follows the timestamps S times faster")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--trace-limit", replay.limit, "--trace: replay only the first N requests (0: all)");
  bool no_offline = false;
  app.add_flag("--no-offline", no_offline, "--trace: skip the offline LRU and Belady figures");
  app.add_option("--hints", replay.hints_admin,
                 "--trace: HOST:PORT of the node's admin endpoint: retain a session's blocks "
                 "while it is paused, as the trace's session hints say (POST /api/v1/hints)");
  CLI11_PARSE(app, argc, argv);

  auto usage = [](const std::string& msg) {
    std::fprintf(stderr, "kvpool-bench: %s\n", msg.c_str());
    return 2;
  };
  {
    std::string_view rest = ops_text;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      Op op;
      if (!ParseOp(item, &op)) return usage("--op: unknown op '" + std::string(item) + "'");
      cfg.ops.push_back(op);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (cfg.ops.empty()) return usage("--op: empty");
  }
  // No --socket: $KVPOOL_SOCKET, as the Python package and kvpoolctl read it.
  if (cfg.socket.empty()) {
    if (const char* env = std::getenv("KVPOOL_SOCKET"); env != nullptr) cfg.socket = env;
  }
  // Sizes and durations are read by the node's own parsers, so a value means
  // the same here as in kvpool-node's flags (a bare duration is milliseconds).
  if (!TakeFlag(SettingsTable::ParseSize("value-size", value_size_text), &cfg.value_size)) return 2;
  if (cfg.value_size < 16) return usage("--value-size must be >= 16 (values carry 8-byte stamps at both ends)");
  if (!TakeFlag(SettingsTable::ParseDuration("duration", duration_text), &cfg.duration_ms)) return 2;
  if (cfg.duration_ms <= 0) return usage("--duration must be > 0");
  if (!TakeFlag(SettingsTable::ParseDuration("warmup", warmup_text), &cfg.warmup_ms)) return 2;
  if (!TakeFlag(SettingsTable::ParseSize("buffer-size", buffer_text), &cfg.buffer_bytes)) return 2;
  cfg.zc_read = zc_read_text == "touch" ? ZcRead::kTouch : ZcRead::kCopy;
  if (!replay.trace_path.empty()) {
    // Values default to 16 KiB per block here, unless --value-size is given.
    replay.value_size = app.count("--value-size") > 0 ? cfg.value_size : replay.value_size;
    std::string_view rest = sockets_text;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      replay.sockets.emplace_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (replay.sockets.empty()) replay.sockets.push_back(cfg.socket);
    replay.ns = app.count("--namespace") > 0 ? cfg.ns : replay.ns;
    replay.timeout_ms = cfg.timeout_ms;
    replay.seed = cfg.seed;
    replay.json = cfg.json;
    replay.offline = !no_offline;
    return kvpool::trace::RunReplay(replay);
  }

  // Working set: >= 1 GiB of values for values >= 1 KiB, so reads come from
  // DRAM, not caches; at most 1Mi keys so small values populate quickly.
  uint64_t keys = cfg.keys;
  if (keys == 0) keys = std::clamp<uint64_t>((kGiB + cfg.value_size - 1) / cfg.value_size, cfg.batch, kMaxDefaultKeys);
  if (keys < cfg.batch) return usage("--keys must be >= --batch (a call reads consecutive distinct keys)");

  bool any_write = false, any_read = false, need_dst = false;
  for (Op op : cfg.ops) {
    any_write |= IsWrite(op);
    any_read |= !IsWrite(op);
    need_dst |= op == Op::kGet || (op == Op::kZcGet && cfg.zc_read == ZcRead::kCopy);
  }
  const bool populate = cfg.populate && any_read;

  // Every (thread, lane) needs at least one block of its own.
  const uint64_t min_region = static_cast<uint64_t>(cfg.threads) * cfg.batch * cfg.value_size;
  const uint64_t region = std::max(min_region, std::min(cfg.buffer_bytes, keys * cfg.value_size));
  // A populate-only source is untimed; a small one spares the pre-touch.
  const uint64_t src_bytes = any_write ? region : std::max(min_region, std::min<uint64_t>(region, 64ull << 20));

  std::vector<kvpool_client*> clients;
  for (int t = 0; t < cfg.threads; ++t) {
    kvpool_options opts;
    kvpool_options_init(&opts);
    opts.socket_path = cfg.socket.empty() ? nullptr : cfg.socket.c_str();
    opts.timeout_ms = cfg.timeout_ms;
    kvpool_status st = KVPOOL_OK;
    kvpool_client* cl = kvpool_open(&opts, &st);
    if (cl == nullptr) {
      std::fprintf(stderr, "kvpool-bench: cannot connect to %s: %s: %s\n",
                   cfg.socket.empty() ? "the default socket" : cfg.socket.c_str(),
                   kvpool_status_name(st), kvpool_last_error());
      for (auto* c : clients) kvpool_close(c);
      return 1;
    }
    clients.push_back(cl);
  }
  const uint64_t max_value = kvpool_max_value_size(clients[0]);
  if (max_value != 0 && cfg.value_size > max_value) {
    std::fprintf(stderr, "kvpool-bench: --value-size %s is over the node's maximum %s\n",
                 FormatBytes(cfg.value_size).c_str(), FormatBytes(max_value).c_str());
    for (auto* c : clients) kvpool_close(c);
    return 1;
  }

  std::unique_ptr<Region> src, dst;
  if (any_write || populate) {
    src = Region::Make(src_bytes, cfg.huge_pages, 0x5a);
    if (!src) return 1;
  }
  if (need_dst) {
    dst = Region::Make(region, cfg.huge_pages, 0);
    if (!dst) return 1;
  }

  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < cfg.threads; ++t) {
    workers.push_back(std::make_unique<Worker>(cfg, t, clients[t], src.get(), dst.get(), keys));
  }

  uint64_t total_errors = 0;
  if (populate) {
    const auto t0 = SteadyClock::now();
    const uint64_t T = workers.size();
    Counts c = OnAllThreads(workers, [&](Worker& w, size_t t) { return w.Populate(keys * t / T, keys * (t + 1) / T); });
    const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::fprintf(stderr,
                 "kvpool-bench: populated %llu keys of %s in %.2fs (%.2f GB/s): %llu stored, %llu already "
                 "present, %llu failed\n",
                 static_cast<unsigned long long>(keys), FormatBytes(cfg.value_size).c_str(), secs,
                 static_cast<double>(c.bytes) / secs / 1e9,
                 static_cast<unsigned long long>(c.statuses[KVPOOL_OK]), static_cast<unsigned long long>(c.existed),
                 static_cast<unsigned long long>(c.errors));
    if (c.errors > 0) {
      std::fprintf(stderr, "kvpool-bench: populate: first error: %s (is the working set over the node's capacity?)\n",
                   c.first_error.c_str());
    }
  }

  std::array<int, 5> runs_of{};  // per op, so "get,zc-get,get,zc-get" numbers reps 0, 1
  for (Op op : cfg.ops) {
    for (int r = 0; r < cfg.repeat; ++r) {
      const int rep = runs_of[static_cast<int>(op)]++;
      const auto measure_from = SteadyClock::now() + std::chrono::milliseconds(cfg.warmup_ms);
      const auto end = measure_from + std::chrono::milliseconds(cfg.duration_ms);
      Counts c = OnAllThreads(workers, [&](Worker& w, size_t) { return w.Run(op, measure_from, end); });
      Report(cfg, op, rep, keys, measure_from, c);
      total_errors += c.errors;
    }
  }
  workers.clear();  // closes the clients
  return total_errors > 0 ? 3 : 0;
}
