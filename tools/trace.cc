#include "tools/trace.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <list>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

namespace kvpool::trace {

namespace {

bool NonNegativeNumber(const nlohmann::json& v) {
  return (v.is_number_unsigned() || v.is_number_integer() || v.is_number_float()) &&
         v.get<double>() >= 0;
}

}  // namespace

Result<std::vector<Request>> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(fmt::format("trace {}: {}", path, std::strerror(errno)));
  std::vector<Request> out;
  std::string line;
  uint64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    auto bad = [&](std::string_view why) {
      return InvalidArgument(fmt::format("trace {} line {}: {}", path, line_no, why));
    };
    if (line.size() > kMaxLineBytes) return bad("longer than 4 MiB");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return bad("not a JSON object");
    for (const char* f : {"timestamp", "input_length", "output_length"}) {
      if (!j.contains(f) || !NonNegativeNumber(j[f])) {
        return bad(fmt::format("\"{}\" is missing or not a non-negative number", f));
      }
    }
    const auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array()) return bad("\"hash_ids\" is missing or not an array");
    if (ids->size() > kMaxBlocksPerRequest) return bad("more than 65536 hash_ids");
    Request r;
    r.timestamp_ms = j["timestamp"].get<double>();
    r.input_length = static_cast<uint64_t>(j["input_length"].get<double>());
    r.output_length = static_cast<uint64_t>(j["output_length"].get<double>());
    r.blocks.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned() && !(id.is_number_integer() && id.get<int64_t>() >= 0)) {
        return bad("a hash_id is not a non-negative integer");
      }
      r.blocks.push_back(id.get<uint64_t>());
    }
    if (const auto sess = j.find("session"); sess != j.end()) {
      if (!sess->is_number_unsigned() &&
          !(sess->is_number_integer() && sess->get<int64_t>() >= 0)) {
        return bad("\"session\" is not a non-negative integer");
      }
      r.session = sess->get<int64_t>();
    }
    if (const auto ret = j.find("retain"); ret != j.end()) {
      if (!ret->is_boolean()) return bad("\"retain\" is not a boolean");
      r.retain = ret->get<bool>();
    }
    if (!out.empty() && r.timestamp_ms < out.back().timestamp_ms) {
      return bad("the timestamp goes backwards");
    }
    out.push_back(std::move(r));
  }
  if (in.bad()) return IOError(fmt::format("trace {}: read failed", path));
  if (out.empty()) return InvalidArgument(fmt::format("trace {} holds no request", path));
  return out;
}

TraceShape Shape(const std::vector<Request>& trace) {
  TraceShape s;
  std::unordered_set<uint64_t> seen;
  for (const Request& r : trace) {
    s.requests++;
    s.block_refs += r.blocks.size();
    s.input_tokens += r.input_length;
    seen.insert(r.blocks.begin(), r.blocks.end());
  }
  s.distinct_blocks = seen.size();
  return s;
}

OfflineResult OfflineLru(const std::vector<Request>& trace, uint64_t capacity,
                         uint64_t block_tokens) {
  OfflineResult res;
  std::list<uint64_t> order;  // least recently used first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  std::vector<uint64_t> missing;
  for (const Request& r : trace) {
    const size_t k = res.Count(r, block_tokens, [&](uint64_t b) { return where.count(b) > 0; });
    for (size_t i = 0; i < k; ++i) order.splice(order.end(), order, where[r.blocks[i]]);
    // What to write is decided before writing, as an engine does from its
    // hit-prefix call: a block cached behind the first miss is not written
    // (and not touched), even if this request's writes evict it.
    missing.clear();
    for (size_t i = k; i < r.blocks.size(); ++i) {
      if (!where.count(r.blocks[i])) missing.push_back(r.blocks[i]);
    }
    for (uint64_t b : missing) {
      if (capacity == 0) break;
      if (where.size() >= capacity) {
        where.erase(order.front());
        order.pop_front();
      }
      where[b] = order.insert(order.end(), b);
    }
  }
  return res;
}

OfflineResult OfflineBelady(const std::vector<Request>& trace, uint64_t capacity,
                            uint64_t block_tokens) {
  // The position of every reference, and of each one's next reference.
  std::vector<uint64_t> flat;
  for (const Request& r : trace) flat.insert(flat.end(), r.blocks.begin(), r.blocks.end());
  constexpr uint64_t kNever = UINT64_MAX;
  std::vector<uint64_t> next(flat.size());
  {
    std::unordered_map<uint64_t, uint64_t> later;
    for (size_t i = flat.size(); i-- > 0;) {
      auto it = later.find(flat[i]);
      next[i] = it == later.end() ? kNever : it->second;
      later[flat[i]] = i;
    }
  }
  OfflineResult res;
  std::unordered_map<uint64_t, uint64_t> cached;  // block -> its next reference
  std::priority_queue<std::pair<uint64_t, uint64_t>> farthest;  // (next use, block), stale ones skipped
  size_t at = 0;
  for (const Request& r : trace) {
    res.Count(r, block_tokens, [&](uint64_t b) { return cached.count(b) > 0; });
    for (size_t i = 0; i < r.blocks.size() && capacity > 0; ++i, ++at) {
      const uint64_t b = r.blocks[i];
      cached[b] = next[at];
      farthest.emplace(next[at], b);
      while (cached.size() > capacity) {
        auto [when, victim] = farthest.top();
        farthest.pop();
        auto it = cached.find(victim);
        if (it != cached.end() && it->second == when) cached.erase(it);
      }
    }
    if (capacity == 0) at += r.blocks.size();
  }
  return res;
}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {
constexpr uint64_t kSeedAdd = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kWordMul = 0xd6e8feb86659fd93ull;
}  // namespace

void FillBlockValue(uint64_t block, uint8_t* out, uint64_t size) {
  const uint64_t seed = Mix64(block + kSeedAdd);
  const uint64_t words = size / 8;
  for (uint64_t w = 0; w < words; ++w) {
    const uint64_t v = seed ^ ((w + 1) * kWordMul);
    std::memcpy(out + w * 8, &v, 8);
  }
  for (uint64_t i = words * 8; i < size; ++i) out[i] = static_cast<uint8_t>(seed >> (i % 8));
}

uint64_t WrongBlockBytes(uint64_t block, const uint8_t* got, uint64_t size) {
  // A right value, the common case, is one pass comparing each derived word
  // in place; a wrong one is then counted byte by byte.
  const uint64_t seed = Mix64(block + kSeedAdd);
  const uint64_t words = size / 8;
  uint64_t diff = 0;
  for (uint64_t w = 0; w < words; ++w) {
    uint64_t v;
    std::memcpy(&v, got + w * 8, 8);
    diff |= v ^ seed ^ ((w + 1) * kWordMul);
  }
  for (uint64_t i = words * 8; i < size; ++i) {
    diff |= got[i] ^ static_cast<uint8_t>(seed >> (i % 8));
  }
  if (diff == 0) return 0;
  std::vector<uint8_t> want(size);
  FillBlockValue(block, want.data(), size);
  uint64_t n = 0;
  for (uint64_t i = 0; i < size; ++i) n += got[i] != want[i];
  return n;
}

}  // namespace kvpool::trace
