// LLM request traces for cache-quality replays (kvpool-bench --trace): the
// Mooncake JSONL format, and the offline caches a replay is compared with.
//
// One JSON object per line: `timestamp` (ms from the start), `input_length`
// and `output_length` (tokens), `hash_ids` (the prompt's blocks in order;
// equal ids across requests are the same KV block, i.e. a shared prefix).
// Optional: `session` (a non-negative integer) and `retain` (a boolean):
// what an orchestrator knows, the request's session and whether it will
// resume after this request (bench/workloads.py's agentic shape writes
// them; kvpool-bench --hints retains the blocks until it does). Other
// fields are ignored.
//
// Prefix semantics throughout: a request uses the leading run of its blocks
// that are cached (its hit prefix), reads those, and writes the blocks after
// it that are not cached. The offline LRU does exactly what a node with
// --eviction lru does under a one-request-at-a-time replay: the hit blocks
// are accessed in chain order, then the missing ones are inserted in chain
// order, each evicting the least recently used entry when full (which ones
// are missing is decided before the first is written, as an engine decides
// from its hit-prefix call). The offline
// Belady cache (the optimal bound) evicts the block whose next reference is
// farthest away.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpool::trace {

struct Request {
  double timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> blocks;
  int64_t session = -1;  // -1: none
  bool retain = false;
};

inline constexpr size_t kMaxLineBytes = 4u << 20;
inline constexpr size_t kMaxBlocksPerRequest = 65536;

// Reads a trace file. A line that is not an object with the four fields
// (numbers, hash_ids an array of non-negative integers of at most
// kMaxBlocksPerRequest) is an error naming the line; blank lines are
// skipped. Timestamps must not go backwards.
Result<std::vector<Request>> LoadTrace(const std::string& path);

struct TraceShape {
  uint64_t requests = 0;
  uint64_t block_refs = 0;
  uint64_t distinct_blocks = 0;
  uint64_t input_tokens = 0;
};
TraceShape Shape(const std::vector<Request>& trace);

// What a cache of `capacity` entries keeps of the trace.
struct OfflineResult {
  uint64_t hit_blocks = 0;   // blocks in the requests' hit prefixes
  uint64_t block_refs = 0;
  uint64_t hit_tokens = 0;   // min(hit blocks x block_tokens, input_length), summed
  uint64_t input_tokens = 0;
  double block_hit_ratio() const { return block_refs ? double(hit_blocks) / block_refs : 0; }
  double token_hit_ratio() const { return input_tokens ? double(hit_tokens) / input_tokens : 0; }
  // Counts request r: its hit prefix is its leading run of blocks for which
  // cached(block) holds. Returns the prefix's length.
  template <typename Cached>
  size_t Count(const Request& r, uint64_t block_tokens, Cached cached);
};
OfflineResult OfflineLru(const std::vector<Request>& trace, uint64_t capacity,
                         uint64_t block_tokens);
OfflineResult OfflineBelady(const std::vector<Request>& trace, uint64_t capacity,
                            uint64_t block_tokens);

// The tokens a request saves with `hit_blocks` blocks cached.
inline uint64_t HitTokens(const Request& r, uint64_t hit_blocks, uint64_t block_tokens) {
  uint64_t t = hit_blocks * block_tokens;
  return t < r.input_length ? t : r.input_length;
}

template <typename Cached>
size_t OfflineResult::Count(const Request& r, uint64_t block_tokens, Cached cached) {
  size_t k = 0;
  while (k < r.blocks.size() && cached(r.blocks[k])) ++k;
  hit_blocks += k;
  block_refs += r.blocks.size();
  hit_tokens += HitTokens(r, k, block_tokens);
  input_tokens += r.input_length;
  return k;
}

// A 64-bit mix (splitmix64's finalizer).
uint64_t Mix64(uint64_t z);

// A replayed block's value: 8-byte words derived from the block's id and the
// word's place, so any byte out of place is found, and making or checking a
// value costs one pass over it.
void FillBlockValue(uint64_t block, uint8_t* out, uint64_t size);
// Bytes of `got` that differ from the block's value (0 for a right value).
uint64_t WrongBlockBytes(uint64_t block, const uint8_t* got, uint64_t size);

}  // namespace kvpool::trace
