#include "tools/trace_replay.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvpool/kvpool.h"
#include "tools/trace.h"

namespace kvpool::trace {

namespace {

using SteadyClock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// dram.entries from a node's statistics; 0 when unknown.
uint64_t DramEntries(kvpool_client* c) {
  std::vector<char> buf(1 << 20);
  size_t len = 0;
  if (kvpool_stats_json(c, buf.data(), buf.size(), &len) != KVPOOL_OK) return 0;
  nlohmann::json j = nlohmann::json::parse(std::string_view(buf.data()), nullptr, false);
  if (!j.is_object() || !j.contains("dram") || !j["dram"].contains("entries")) return 0;
  return j["dram"]["entries"].get<uint64_t>();
}

struct Node {
  kvpool_client* client = nullptr;
  uint64_t requests = 0;
  uint64_t max_entries = 0;
};

// The trace's session hints, acted on as an orchestrator would
// (ReplayConfig::hints_admin): retain a paused session's blocks until its
// next request, each block while any paused session holds it.
class Orchestrator {
 public:
  Orchestrator(const std::string& admin, std::string ns, uint32_t ttl_s)
      : ns_(std::move(ns)), ttl_s_(ttl_s) {
    const auto colon = admin.rfind(':');
    const int port = colon == std::string::npos ? 0 : std::atoi(admin.c_str() + colon + 1);
    if (port > 0) http_ = std::make_unique<httplib::Client>(admin.substr(0, colon), port);
  }
  bool ok() const { return http_ != nullptr; }

  // After request r is served.
  void After(const Request& r) {
    if (r.session < 0) return;
    std::vector<uint64_t>& held = held_[r.session];
    std::unordered_set<uint64_t> now;
    if (r.retain) now.insert(r.blocks.begin(), r.blocks.end());
    // The whole context is retained again (in chain order), so its lease
    // runs from this pause; a block shared with other paused sessions gets
    // the later of their leases.
    std::vector<uint64_t> retain;
    std::vector<uint64_t> release;
    if (r.retain) {
      for (uint64_t b : r.blocks) {
        if (std::find(held.begin(), held.end(), b) == held.end()) ++count_[b];
        retain.push_back(b);
      }
    }
    for (uint64_t b : held) {
      if (now.count(b) == 0 && --count_[b] == 0) {
        count_.erase(b);
        release.push_back(b);
      }
    }
    held.assign(now.begin(), now.end());
    if (held.empty()) held_.erase(r.session);
    Send("retain", retain);
    Send("release", release);
  }

  uint64_t sent() const { return sent_; }
  uint64_t refused() const { return refused_; }

 private:
  void Send(const char* op, const std::vector<uint64_t>& blocks) {
    constexpr size_t kBatch = 8192;  // the node's most keys per hint
    for (size_t at = 0; at < blocks.size(); at += kBatch) {
      nlohmann::json h = {{"op", op}, {"namespace", ns_}, {"keys", nlohmann::json::array()}};
      if (std::string_view(op) != "release") h["ttl_s"] = ttl_s_;
      for (size_t i = at; i < std::min(blocks.size(), at + kBatch); ++i) {
        h["keys"].push_back("b" + std::to_string(blocks[i]));
      }
      auto res = http_->Post("/api/v1/hints", h.dump(), "application/json");
      ++sent_;
      if (!res || res->status != 200) ++refused_;
    }
  }

  const std::string ns_;
  const uint32_t ttl_s_;
  std::unique_ptr<httplib::Client> http_;
  std::unordered_map<int64_t, std::vector<uint64_t>> held_;  // by session
  std::unordered_map<uint64_t, uint32_t> count_;             // sessions holding a block
  uint64_t sent_ = 0, refused_ = 0;
};

}  // namespace

int RunReplay(const ReplayConfig& cfg) {
  Result<std::vector<Request>> loaded = LoadTrace(cfg.trace_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  std::vector<Request> trace = std::move(loaded).value();
  if (cfg.limit > 0 && trace.size() > cfg.limit) trace.resize(cfg.limit);
  const TraceShape shape = Shape(trace);

  std::unique_ptr<Orchestrator> orchestrator;
  if (!cfg.hints_admin.empty()) {
    orchestrator = std::make_unique<Orchestrator>(cfg.hints_admin, cfg.ns, cfg.hint_ttl_s);
    if (!orchestrator->ok()) {
      std::fprintf(stderr, "kvpool-bench: --hints wants HOST:PORT, got '%s'\n",
                   cfg.hints_admin.c_str());
      return 1;
    }
  }
  bool sessions = false;
  for (const Request& r : trace) sessions = sessions || r.session >= 0;
  // Requests of a session after its first (a resume), and the others.
  std::unordered_set<int64_t> seen_sessions;
  uint64_t resume_refs = 0, resume_hits = 0, other_refs = 0, other_hits = 0;

  std::vector<Node> nodes;
  auto close_all = [&] {
    for (Node& n : nodes) kvpool_close(n.client);
  };
  for (const std::string& sock : cfg.sockets) {
    kvpool_options o;
    kvpool_options_init(&o);
    o.socket_path = sock.empty() ? nullptr : sock.c_str();
    o.timeout_ms = cfg.timeout_ms;
    kvpool_status st = KVPOOL_OK;
    kvpool_client* c = kvpool_open(&o, &st);
    if (c == nullptr) {
      std::fprintf(stderr, "kvpool-bench: cannot connect to %s: %s: %s\n",
                   sock.empty() ? "the default socket" : sock.c_str(), kvpool_status_name(st),
                   kvpool_last_error());
      close_all();
      return 1;
    }
    nodes.push_back(Node{c});
  }
  const uint64_t max_value = kvpool_max_value_size(nodes[0].client);
  if (max_value != 0 && cfg.value_size > max_value) {
    std::fprintf(stderr, "kvpool-bench: --value-size is over the node's maximum\n");
    close_all();
    return 1;
  }

  size_t longest = 1;
  for (const Request& r : trace) longest = std::max(longest, r.blocks.size());
  const uint64_t vs = cfg.value_size;
  std::vector<uint8_t> buf(longest * vs);
  std::vector<std::string> names(longest);
  std::vector<const void*> name_ptrs(longest);
  std::vector<size_t> name_lens(longest);
  std::vector<kvpool_key_id> ids(longest), put_ids(longest);
  std::vector<uint8_t> hits(longest);
  std::vector<void*> dst(longest);
  std::vector<const void*> src(longest);
  std::vector<uint64_t> caps(longest, vs), sizes(longest), put_sizes(longest, vs);
  std::vector<kvpool_status> statuses(longest);
  std::vector<uint64_t> put_blocks(longest);

  uint64_t hit_blocks = 0, hit_tokens = 0, bytes_read = 0, bytes_written = 0, wrong_bytes = 0;
  uint64_t failed_items = 0, lost_hits = 0, existed = 0;
  std::string first_error;
  std::vector<double> latency_us;
  latency_us.reserve(trace.size());
  uint64_t rng = cfg.seed * 0x9e3779b97f4a7c15ull + 1;
  const auto start = SteadyClock::now();
  for (size_t ri = 0; ri < trace.size(); ++ri) {
    const Request& r = trace[ri];
    size_t which = 0;
    if (cfg.route == "random") {
      which = static_cast<size_t>(Mix64(rng += 0x9e3779b97f4a7c15ull) % nodes.size());
    } else if (cfg.route == "affinity") {
      which = r.blocks.empty() ? 0 : static_cast<size_t>(Mix64(r.blocks[0]) % nodes.size());
    } else {
      which = ri % nodes.size();
    }
    Node& node = nodes[which];
    node.requests++;
    if (cfg.speed > 0) {
      std::this_thread::sleep_until(
          start + std::chrono::microseconds(static_cast<int64_t>(r.timestamp_ms * 1000 / cfg.speed)));
    }
    const size_t n = r.blocks.size();
    const auto t0 = SteadyClock::now();
    for (size_t i = 0; i < n; ++i) {
      names[i] = "b" + std::to_string(r.blocks[i]);
      name_ptrs[i] = names[i].data();
      name_lens[i] = names[i].size();
    }
    kvpool_key_ids(cfg.ns.data(), cfg.ns.size(), name_ptrs.data(), name_lens.data(), n, ids.data());
    size_t prefix = 0;
    kvpool_status st = n == 0 ? KVPOOL_OK : kvpool_exists(node.client, ids.data(), n, hits.data(), &prefix);
    if (st != KVPOOL_OK) {
      failed_items += n;
      if (first_error.empty()) first_error = std::string("exists: ") + kvpool_status_name(st);
      continue;
    }
    // The hit prefix, read and checked.
    size_t got = 0;
    if (prefix > 0) {
      for (size_t i = 0; i < prefix; ++i) dst[i] = buf.data() + i * vs;
      st = kvpool_get(node.client, ids.data(), dst.data(), caps.data(), prefix, sizes.data(),
                      statuses.data());
      // Every block read is checked; the hit prefix ends at the first that
      // is not there (or not right).
      for (size_t i = 0; i < prefix; ++i) {
        kvpool_status s = st == KVPOOL_OK ? statuses[i] : st;
        if (s == KVPOOL_OK && sizes[i] != vs) {
          wrong_bytes += vs;  // wrong size
        } else if (s == KVPOOL_OK) {
          uint64_t wrong = WrongBlockBytes(r.blocks[i], buf.data() + i * vs, vs);
          wrong_bytes += wrong;
          if (wrong == 0) {
            bytes_read += vs;
            if (got == i) ++got;
          }
        } else if (s == KVPOOL_NOT_FOUND) {
          ++lost_hits;  // evicted between the exists and the get
        } else {
          ++failed_items;
          if (first_error.empty()) first_error = std::string("get: ") + kvpool_status_name(s);
        }
      }
    }
    hit_blocks += got;
    hit_tokens += HitTokens(r, got, cfg.block_tokens);
    const bool resume = r.session >= 0 && !seen_sessions.insert(r.session).second;
    (resume ? resume_refs : other_refs) += n;
    (resume ? resume_hits : other_hits) += got;
    // The blocks after the prefix that are not cached, written.
    size_t m = 0;
    for (size_t i = got; i < n; ++i) {
      if (i >= prefix && hits[i]) continue;  // cached behind the first miss
      uint8_t* p = buf.data() + m * vs;
      FillBlockValue(r.blocks[i], p, vs);
      src[m] = p;
      put_ids[m] = ids[i];
      put_blocks[m] = r.blocks[i];
      ++m;
    }
    if (m > 0) {
      st = kvpool_put(node.client, put_ids.data(), src.data(), put_sizes.data(), m, statuses.data());
      for (size_t i = 0; i < m; ++i) {
        kvpool_status s = statuses[i];
        if (s == KVPOOL_OK) {
          bytes_written += vs;
        } else if (s == KVPOOL_ALREADY_EXISTS) {
          ++existed;
        } else {
          ++failed_items;
          if (first_error.empty()) {
            first_error = std::string("put: ") + kvpool_status_name(s != KVPOOL_OK ? s : st);
          }
        }
      }
    }
    latency_us.push_back(
        std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
    if (orchestrator) orchestrator->After(r);
    if ((ri & 63) == 63 || ri + 1 == trace.size()) {
      node.max_entries = std::max(node.max_entries, DramEntries(node.client));
    }
  }
  const double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  uint64_t capacity = 0;
  for (Node& node : nodes) {
    node.max_entries = std::max(node.max_entries, DramEntries(node.client));
    capacity += node.max_entries;
  }
  close_all();

  const double block_hit = shape.block_refs ? double(hit_blocks) / shape.block_refs : 0;
  const double token_hit = shape.input_tokens ? double(hit_tokens) / shape.input_tokens : 0;
  OfflineResult lru, belady;
  if (cfg.offline) {
    lru = OfflineLru(trace, capacity, cfg.block_tokens);
    belady = OfflineBelady(trace, capacity, cfg.block_tokens);
  }
  nlohmann::ordered_json j = {
      {"trace", cfg.trace_path},
      {"requests", shape.requests},
      {"block_refs", shape.block_refs},
      {"distinct_blocks", shape.distinct_blocks},
      {"nodes", nodes.size()},
      {"route", cfg.route},
      {"value_size", vs},
      {"capacity_entries", capacity},
      {"block_hit_ratio", block_hit},
      {"token_hit_ratio", token_hit},
      {"offline_lru_block_hit_ratio", lru.block_hit_ratio()},
      {"offline_belady_block_hit_ratio", belady.block_hit_ratio()},
      {"offline_lru_token_hit_ratio", lru.token_hit_ratio()},
      {"bytes_read", bytes_read},
      {"bytes_written", bytes_written},
      {"puts_existed", existed},
      {"lost_hits", lost_hits},
      {"wrong_bytes", wrong_bytes},
      {"failed_items", failed_items},
      {"seconds", secs},
      {"requests_per_s", secs > 0 ? double(trace.size()) / secs : 0},
      {"latency_us", {{"p50", Percentile(latency_us, 0.50)},
                      {"p90", Percentile(latency_us, 0.90)},
                      {"p99", Percentile(latency_us, 0.99)}}},
  };
  if (!first_error.empty()) j["first_error"] = first_error;
  auto ratio = [](uint64_t a, uint64_t b) { return b ? double(a) / double(b) : 0.0; };
  if (sessions) {
    j["resume_block_hit_ratio"] = ratio(resume_hits, resume_refs);
    j["other_block_hit_ratio"] = ratio(other_hits, other_refs);
  }
  if (orchestrator) {
    j["hints_sent"] = orchestrator->sent();
    j["hints_refused"] = orchestrator->refused();
  }
  if (cfg.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "trace %s: %llu requests, %llu block refs, %llu distinct blocks; %zu node(s), %s, "
        "%llu entries reached\n"
        "  block hit ratio %.4f (offline LRU %.4f, Belady %.4f), token hit ratio %.4f\n"
        "  read %.1f MiB, wrote %.1f MiB, %.0f requests/s, latency p50 %.0f us p90 %.0f us "
        "p99 %.0f us\n"
        "  wrong bytes %llu, failed items %llu, hits lost between exists and get %llu\n",
        cfg.trace_path.c_str(), static_cast<unsigned long long>(shape.requests),
        static_cast<unsigned long long>(shape.block_refs),
        static_cast<unsigned long long>(shape.distinct_blocks), nodes.size(), cfg.route.c_str(),
        static_cast<unsigned long long>(capacity), block_hit, lru.block_hit_ratio(),
        belady.block_hit_ratio(), token_hit, bytes_read / 1048576.0, bytes_written / 1048576.0,
        secs > 0 ? trace.size() / secs : 0, Percentile(latency_us, 0.5),
        Percentile(latency_us, 0.9), Percentile(latency_us, 0.99),
        static_cast<unsigned long long>(wrong_bytes), static_cast<unsigned long long>(failed_items),
        static_cast<unsigned long long>(lost_hits));
    if (!first_error.empty()) std::printf("  first error: %s\n", first_error.c_str());
  }
  std::printf("metric trace_block_hit_ratio %.6f\n", block_hit);
  std::printf("metric trace_token_hit_ratio %.6f\n", token_hit);
  std::printf("metric trace_capacity_entries %llu\n", static_cast<unsigned long long>(capacity));
  if (cfg.offline) {
    std::printf("metric trace_offline_lru_hit_ratio %.6f\n", lru.block_hit_ratio());
    std::printf("metric trace_offline_belady_hit_ratio %.6f\n", belady.block_hit_ratio());
  }
  if (sessions) {
    std::printf("metric trace_resume_block_hit_ratio %.6f\n", ratio(resume_hits, resume_refs));
    std::printf("metric trace_other_block_hit_ratio %.6f\n", ratio(other_hits, other_refs));
  }
  if (orchestrator) {
    std::printf("metric trace_hints_sent %llu\n",
                static_cast<unsigned long long>(orchestrator->sent()));
    std::printf("metric trace_hints_refused %llu\n",
                static_cast<unsigned long long>(orchestrator->refused()));
  }
  std::printf("metric trace_wrong_bytes %llu\n", static_cast<unsigned long long>(wrong_bytes));
  std::printf("metric trace_failed_items %llu\n", static_cast<unsigned long long>(failed_items));
  std::printf("metric trace_requests_per_s %.1f\n", secs > 0 ? trace.size() / secs : 0);
  return wrong_bytes > 0 || failed_items > 0 ? 3 : 0;
}

}  // namespace kvpool::trace
