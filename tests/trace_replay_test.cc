// kvpool-bench --trace against real nodes: a node with --eviction lru keeps
// exactly what the replay's offline LRU keeps, every byte read is right, the
// default policy keeps more than LRU on conversation traffic, and a replay
// spreads over several nodes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/node_process.h"

namespace kvpool::testing {
namespace {

// A small trace shaped like chat traffic: three shared system prompts of 4
// blocks, 200 conversations of 2 to 9 turns (each turn re-reads the whole
// conversation and adds 6 blocks, the last one partial), interleaved with
// one-off prompts of 64 fresh blocks that are never read again.
std::string WriteTrace(const std::string& dir) {
  std::mt19937_64 rng(7);
  uint64_t next_block = 1000;
  struct Conversation {
    std::vector<uint64_t> chain;
    int turns_left;
  };
  std::vector<Conversation> live;
  std::string path = dir + "/trace.jsonl";
  std::ofstream out(path);
  double ts = 0;
  int started = 0;
  for (int r = 0; r < 1500; ++r) {
    ts += 50;
    std::vector<uint64_t> ids;
    if (rng() % 4 == 0) {
      for (int i = 0; i < 64; ++i) ids.push_back(next_block++);
    } else {
      if (live.empty() || (started < 200 && rng() % 3 == 0)) {
        Conversation c;
        uint64_t sys = rng() % 3;
        for (uint64_t i = 0; i < 4; ++i) c.chain.push_back(sys * 10 + i);
        c.turns_left = 2 + static_cast<int>(rng() % 8);
        live.push_back(c);
        ++started;
      }
      Conversation& c = live[rng() % live.size()];
      // The previous turn's partial last block is replaced by full ones.
      if (c.chain.size() > 4) c.chain.pop_back();
      for (int i = 0; i < 6; ++i) c.chain.push_back(next_block++);
      ids = c.chain;
      if (--c.turns_left == 0) {
        c = live.back();
        live.pop_back();
      }
    }
    nlohmann::json j = {{"timestamp", ts},
                        {"input_length", ids.size() * 512 - 100},
                        {"output_length", 50},
                        {"hash_ids", ids}};
    out << j.dump() << "\n";
  }
  return path;
}

nlohmann::json Replay(const std::string& trace, const std::string& sockets) {
  std::string out;
  int rc = RunCommand({KVPOOL_BENCH_BIN, "--trace", trace, "--sockets", sockets, "--json"}, &out);
  EXPECT_EQ(rc, 0) << out;
  size_t nl = out.find('\n');
  return nlohmann::json::parse(out.substr(0, nl), nullptr, false);
}

class TraceReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool-trace-XXXXXX";
    dir_ = mkdtemp(tmpl);
    trace_ = WriteTrace(dir_);
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    int r = system(cmd.c_str());
    (void)r;
  }
  std::string dir_, trace_;
};

TEST_F(TraceReplayTest, AnLruNodeKeepsExactlyWhatTheOfflineLruKeeps) {
  // 16 MiB of 16 KiB values: 1,024 entries, a fraction of the trace's blocks.
  auto node = NodeProcess::Start({"--dram-capacity", "16MiB", "--slab-size", "1MiB",
                                  "--eviction", "lru"});
  ASSERT_NE(node, nullptr);
  nlohmann::json r = Replay(trace_, node->socket());
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["capacity_entries"].get<uint64_t>(), 1024u);
  EXPECT_EQ(r["wrong_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(r["failed_items"].get<uint64_t>(), 0u);
  EXPECT_GT(r["block_hit_ratio"].get<double>(), 0.1);
  EXPECT_EQ(r["block_hit_ratio"].get<double>(), r["offline_lru_block_hit_ratio"].get<double>());
  EXPECT_EQ(r["token_hit_ratio"].get<double>(), r["offline_lru_token_hit_ratio"].get<double>());
  EXPECT_GE(r["offline_belady_block_hit_ratio"].get<double>(), r["block_hit_ratio"].get<double>());
  EXPECT_GT(r["bytes_read"].get<uint64_t>(), 0u);
}

TEST_F(TraceReplayTest, TheDefaultPolicyKeepsMoreThanLru) {
  auto node = NodeProcess::Start({"--dram-capacity", "16MiB", "--slab-size", "1MiB"});
  ASSERT_NE(node, nullptr);
  nlohmann::json r = Replay(trace_, node->socket());
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["wrong_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(r["failed_items"].get<uint64_t>(), 0u);
  EXPECT_GT(r["block_hit_ratio"].get<double>(),
            1.05 * r["offline_lru_block_hit_ratio"].get<double>());
  std::printf("default %.4f, offline LRU %.4f, Belady %.4f\n",
              r["block_hit_ratio"].get<double>(), r["offline_lru_block_hit_ratio"].get<double>(),
              r["offline_belady_block_hit_ratio"].get<double>());
}

TEST_F(TraceReplayTest, RequestsAreSpreadOverSeveralNodes) {
  auto a = NodeProcess::Start({"--dram-capacity", "16MiB", "--slab-size", "1MiB"});
  auto b = NodeProcess::Start({"--dram-capacity", "16MiB", "--slab-size", "1MiB"});
  ASSERT_TRUE(a && b);
  nlohmann::json r = Replay(trace_, a->socket() + "," + b->socket());
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["nodes"].get<uint64_t>(), 2u);
  EXPECT_EQ(r["capacity_entries"].get<uint64_t>(), 2048u);
  EXPECT_EQ(r["wrong_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(r["block_hit_ratio"].get<double>(), 0.0);
  // A socket that is not there is a setup failure, exit 1.
  std::string out;
  EXPECT_EQ(RunCommand({KVPOOL_BENCH_BIN, "--trace", trace_, "--sockets", dir_ + "/none.sock"},
                       &out, true),
            1)
      << out;
  EXPECT_EQ(RunCommand({KVPOOL_BENCH_BIN, "--trace", dir_ + "/missing.jsonl"}, &out, true), 1);
  EXPECT_NE(out.find("missing.jsonl"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing
