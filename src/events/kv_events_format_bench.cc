// kv_events_format_bench: what encoding a batch of described events costs
// the publisher's thread, per event, and what reading a descriptor in place
// costs (ParseDescriptor, done once per described event of a batch).
//
// The batch: 1,000 blocks of 16 tokens, each described (an engine hash, a
// parent, the tokens, group 0), stored and removed in turn, each its own
// event, in the map encoding with int64 hashes: the node's defaults, and
// the shape of bench/compare.sh events' described runs, where every put
// is its own chain and evicts one block.
//
// Usage: kv_events_format_bench [reps]   (default 50; the best rep is printed)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "events/kv_events_format.h"
#include "protocol/descriptor_format.h"

using namespace kvpool;

namespace {

constexpr int kBlocks = 1000;
constexpr int kTokens = 16;
constexpr int kRounds = 20;  // batches per timed rep

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  std::vector<std::string> descs;
  for (int i = 0; i < kBlocks; ++i) {
    protocol::BlockDescriptor d;
    d.hash = {protocol::EngineHash::Kind::kUint64, 1000 + 7ull * i, {}};
    d.parent = {protocol::EngineHash::Kind::kUint64, 999 + 13ull * i, {}};
    d.block_size = kTokens;
    for (int t = 0; t < kTokens; ++t) d.token_ids.push_back(static_cast<uint32_t>(i * kTokens + t));
    d.group_idx = 0;
    auto b = protocol::EncodeDescriptor(d);
    if (!b.ok()) return 1;
    descs.push_back(std::move(b).value());
  }
  std::vector<protocol::DescriptorView> views(kBlocks);
  std::vector<KeyId> keys;
  std::vector<events::EventRun> runs;
  for (int i = 0; i < kBlocks; ++i) {
    if (!protocol::ParseDescriptor(Bytes(descs[i]), &views[i]).ok()) return 1;
    keys.push_back(KeyId{0x9e3779b97f4a7c15ull * (i + 1), static_cast<uint64_t>(i)});
    const auto type = i % 2 == 0 ? events::KvEvent::Type::kStored : events::KvEvent::Type::kRemoved;
    const auto at = static_cast<uint32_t>(i);
    runs.push_back(events::EventRun{type, events::Medium::kCpu, at, at + 1, true});
  }
  using Clock = std::chrono::steady_clock;
  auto ns_per = [](Clock::time_point t0, double n) {
    return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
  };
  std::string out;
  out.reserve(events::EncodedBatchBound(runs, keys, views));
  double encode = 1e18, parse = 1e18;
  size_t parsed = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int k = 0; k < kRounds; ++k) {
      events::EncodeBatchInto(&out, 1.0, runs, keys, events::Encoding::kMap,
                              events::HashType::kInt64, views);
    }
    encode = std::min(encode, ns_per(t0, 1.0 * kRounds * kBlocks));
    t0 = Clock::now();
    for (int k = 0; k < kRounds; ++k) {
      for (const std::string& d : descs) {
        protocol::DescriptorView v;
        parsed += protocol::ParseDescriptor(Bytes(d), &v).ok();
      }
    }
    parse = std::min(parse, ns_per(t0, 1.0 * kRounds * kBlocks));
  }
  if (parsed != static_cast<size_t>(reps) * kRounds * kBlocks) return 1;
  std::printf(
      "encode %.1f ns per described event (%zu bytes per batch of %d), parse %.1f ns per "
      "descriptor\n",
      encode, out.size(), kBlocks, parse);
  return 0;
}
