// Trace files and the offline caches, on hand-made traces with exact
// expected hits.
#include "tools/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace kvpool::trace {
namespace {

Request R(std::vector<uint64_t> blocks, uint64_t input = 0) {
  Request r;
  r.blocks = std::move(blocks);
  r.input_length = input ? input : r.blocks.size() * 4;
  return r;
}

TEST(OfflineLru, PrefixSemanticsChainOrderAndEviction) {
  // Capacity 3. Request 2 hits 1,2 (3 is missing); request 3's chain starts
  // with 4, absent, so 1 is not a hit for it even though it is cached.
  std::vector<Request> t = {R({1, 2, 3}), R({1, 2, 5}), R({4, 1}), R({1, 2})};
  OfflineResult r = OfflineLru(t, 3, 4);
  // 1: miss x3 (insert 1,2,3). 2: hits 1,2 (touch), insert 5 evicting 3.
  // 3: 4 misses; 1, cached behind the miss, is not written: inserting 4
  // evicts 1. 4: 1 misses.
  EXPECT_EQ(r.hit_blocks, 0u + 2 + 0 + 0);
  EXPECT_EQ(r.block_refs, 3u + 3 + 2 + 2);
  EXPECT_EQ(r.input_tokens, 12u + 12 + 8 + 8);
  EXPECT_EQ(r.hit_tokens, 0u + 8 + 0 + 0);
}

TEST(OfflineLru, ABlockCachedBehindTheFirstMissIsNotTouched) {
  // Capacity 2: {1,2}; request {3,1} misses 3, 1 is cached but behind the
  // miss: not written and not touched, so inserting 3 evicts 1 (the least
  // recent) and 2 stays.
  std::vector<Request> t = {R({1}), R({2}), R({3, 1}), R({2}), R({1})};
  EXPECT_EQ(OfflineLru(t, 2, 4).hit_blocks, 1u);
  // With capacity 3 everything stays.
  EXPECT_EQ(OfflineLru(t, 3, 4).hit_blocks, 2u);
}

TEST(OfflineBelady, KeepsWhatIsReusedSoonest) {
  // Capacity 2: 1 and 2 cached; 3 arrives, 2 is used next and 1 never:
  // Belady evicts 1 (LRU would evict 1 too); then 2 hits, 3 hits.
  std::vector<Request> t = {R({1}), R({2}), R({3}), R({2}), R({3})};
  EXPECT_EQ(OfflineBelady(t, 2, 4).hit_blocks, 2u);
  // A pattern LRU gets wrong: cyclic over 3 blocks with capacity 2.
  std::vector<Request> cyc;
  for (int i = 0; i < 9; ++i) cyc.push_back(R({static_cast<uint64_t>(i % 3)}));
  EXPECT_EQ(OfflineLru(cyc, 2, 4).hit_blocks, 0u);
  EXPECT_EQ(OfflineBelady(cyc, 2, 4).hit_blocks, 4u);  // 0 and 1 kept: t3, t4, t6, t7
  // Never worse than LRU, and at capacity 0 nothing hits.
  EXPECT_GE(OfflineBelady(t, 1, 4).hit_blocks, OfflineLru(t, 1, 4).hit_blocks);
  EXPECT_EQ(OfflineBelady(t, 0, 4).hit_blocks, 0u);
  EXPECT_EQ(OfflineLru(t, 0, 4).hit_blocks, 0u);
}

TEST(OfflineResultTest, HitTokensAreCappedAtTheInput) {
  Request r = R({1, 2, 3}, 1100);  // the last block is partial
  EXPECT_EQ(HitTokens(r, 2, 512), 1024u);
  EXPECT_EQ(HitTokens(r, 3, 512), 1100u);
}

class TraceFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool-trace-XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  void Write(const std::string& text) { std::ofstream(path_) << text; }
  std::string path_;
};

TEST_F(TraceFile, ReadsRequestsAndTheirShape) {
  Write(R"({"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}
{"timestamp": 12.5, "input_length": 600, "output_length": 1, "hash_ids": [7, 9], "extra": 1}
{"timestamp": 13, "input_length": 600, "output_length": 1, "hash_ids": [7], "session": 4, "retain": true}

)");
  auto t = LoadTrace(path_);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[1].timestamp_ms, 12.5);
  EXPECT_EQ((*t)[1].blocks, (std::vector<uint64_t>{7, 9}));
  EXPECT_EQ((*t)[1].session, -1);  // no session hint
  EXPECT_FALSE((*t)[1].retain);
  EXPECT_EQ((*t)[2].session, 4);
  EXPECT_TRUE((*t)[2].retain);
  TraceShape s = Shape(*t);
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.block_refs, 5u);
  EXPECT_EQ(s.distinct_blocks, 3u);
  EXPECT_EQ(s.input_tokens, 2200u);
}

TEST_F(TraceFile, ABadLineIsNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json\n", "line 1: not a JSON object"},
      {R"({"timestamp": 0, "input_length": 1, "output_length": 1})", "hash_ids"},
      {R"({"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []})",
       "input_length"},
      {R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, "x"]})",
       "hash_id"},
      {"{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
       "{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n",
       "line 2: the timestamp goes backwards"},
      {R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [], "session": -2})",
       "\"session\" is not a non-negative integer"},
      {R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [], "retain": 1})",
       "\"retain\" is not a boolean"},
      {"\n", "holds no request"},
  };
  for (const auto& [text, says] : cases) {
    Write(text);
    auto t = LoadTrace(path_);
    ASSERT_FALSE(t.ok()) << says;
    EXPECT_NE(t.status().message().find(says), std::string::npos) << t.status().message();
  }
  EXPECT_EQ(LoadTrace("/nonexistent/trace.jsonl").status().code(), StatusCode::kNotFound);
}

TEST(BlockValue, CheckCountsExactlyTheBytesOutOfPlace) {
  // 61 bytes: seven words and a 5-byte tail.
  std::vector<uint8_t> v(61);
  FillBlockValue(42, v.data(), v.size());
  EXPECT_EQ(WrongBlockBytes(42, v.data(), v.size()), 0u);
  EXPECT_NE(WrongBlockBytes(43, v.data(), v.size()), 0u);  // another block's value
  v[0] ^= 1;
  v[30] ^= 0x80;
  v[60] ^= 0xff;  // in the tail
  EXPECT_EQ(WrongBlockBytes(42, v.data(), v.size()), 3u);
  std::vector<uint8_t> other(61);
  FillBlockValue(43, other.data(), other.size());
  EXPECT_NE(other, v);
}

}  // namespace
}  // namespace kvpool::trace
