// kvpool-bench --trace: replays an LLM request trace (tools/trace.h) against
// one or more nodes over the C ABI, as an engine with a prefix cache would.
//
// Per request, on the node routing picks: kvpool_exists over the request's
// block chain (its hit prefix), kvpool_get of the hit blocks (every byte
// checked: a block's value is derived from its id), kvpool_put of the
// blocks after the prefix that are not cached. Requests run one at a time,
// as fast as possible or at the trace's timestamps scaled by `speed`.
//
// Afterwards it reads the entries the nodes reached and computes, for that
// capacity, what the offline LRU and Belady caches keep of the same trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpool::trace {

struct ReplayConfig {
  std::string trace_path;
  std::vector<std::string> sockets;  // empty entry: libkvpool's default socket
  std::string route = "round-robin";  // round-robin | random | affinity
  uint64_t block_tokens = 512;
  uint64_t value_size = 16 * 1024;
  double speed = 0;  // 0: as fast as possible; else the timestamps divided by it
  uint64_t limit = 0;  // requests replayed (0: all)
  std::string ns = "kvpool-trace";
  uint32_t timeout_ms = 5000;
  uint64_t seed = 1;
  bool json = false;
  bool offline = true;  // compute the offline LRU and Belady ratios
  // HOST:PORT of the node's admin endpoint: act on the trace's session
  // hints as an orchestrator would (POST /api/v1/hints): a request whose
  // session will resume has its blocks retained (for hint_ttl_s) until the
  // session's next request; a block that paused sessions share stays
  // retained while any of them holds it. Empty: no hints.
  std::string hints_admin;
  uint32_t hint_ttl_s = 600;
};

// Runs the replay and prints the report (and `metric` lines). Exit status:
// 0 ok, 1 setup failure, 3 ran but found wrong bytes or failed calls.
int RunReplay(const ReplayConfig& cfg);

}  // namespace kvpool::trace
