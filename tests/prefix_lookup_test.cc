// Block descriptors and routers' prefix lookups against real kvpool-node
// processes (and a real etcd for the cluster): described puts at one node,
// bad descriptors refused per item and per request; then three nodes, one
// with most of its blocks on SSD, whose cluster answers (asked of each
// node, over HTTP, the C ABI and kvpoolctl) equal what each node itself
// holds; a killed node leaves the answers within its lease; bad lookups
// are answered 400 and the node goes on serving.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "harness/cluster_harness.h"
#include "protocol/descriptor_format.h"
#include "ssd_test_util.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kChainBase = 0x5eed000000000000ull;
constexpr uint32_t kBlock = 16;

uint64_t Hash(int i) { return kChainBase + static_cast<uint64_t>(i); }

// What an engine says of block i of the chain: int hash, parent, 16 tokens.
std::string Descriptor(int i) {
  protocol::BlockDescriptor d;
  d.hash = {protocol::EngineHash::Kind::kUint64, Hash(i), ""};
  if (i > 0) d.parent = {protocol::EngineHash::Kind::kUint64, Hash(i - 1), ""};
  d.block_size = kBlock;
  for (uint32_t t = 0; t < kBlock; ++t)
    d.token_ids.push_back(static_cast<uint32_t>(i) * kBlock + t);
  d.group_idx = 0;
  auto b = protocol::EncodeDescriptor(d);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? *b : std::string();
}

// Puts blocks `blocks` of the chain (each under `ranks` keys, as a TP
// engine writes one key per rank) with their descriptors; values of `size`.
void PutBlocks(kvpool_client* c, const std::string& ns, const std::vector<int>& blocks, int ranks,
               size_t size) {
  std::vector<kvpool_key_id> ids;
  std::vector<std::string> descs;
  std::vector<std::vector<uint8_t>> vals;
  for (int b : blocks) {
    for (int r = 0; r < ranks; ++r) {
      const std::string key = "block" + std::to_string(b) + "/tp" + std::to_string(r);
      const void* k = key.data();
      size_t len = key.size();
      kvpool_key_id id;
      kvpool_key_ids(ns.data(), ns.size(), &k, &len, 1, &id);
      ids.push_back(id);
      descs.push_back(Descriptor(b));
      vals.emplace_back(size, static_cast<uint8_t>(b * 7 + r));
    }
  }
  for (size_t off = 0; off < ids.size(); off += 8) {
    const size_t n = std::min<size_t>(8, ids.size() - off);
    std::vector<const void*> v;
    std::vector<uint64_t> sizes;
    std::vector<kvpool_descriptor> d;
    for (size_t i = off; i < off + n; ++i) {
      v.push_back(vals[i].data());
      sizes.push_back(vals[i].size());
      d.push_back({descs[i].data(), descs[i].size()});
    }
    std::vector<kvpool_status> st(n, -1);
    ASSERT_EQ(
        kvpool_put_described(c, ids.data() + off, v.data(), sizes.data(), d.data(), n, st.data()),
        KVPOOL_OK)
        << kvpool_last_error();
  }
}

std::string HashesBody(int n, const std::string& extra = "") {
  std::string body = "{\"hashes\": [";
  for (int i = 0; i < n; ++i) body += (i ? "," : "") + std::to_string(Hash(i));
  return body + "]" + extra + "}";
}

// The holders of an answer as comparable rows: node, blocks, dram, ssd, tiers.
using Row = std::tuple<std::string, uint32_t, uint32_t, uint32_t, std::string>;
std::vector<Row> Rows(const nlohmann::json& answer) {
  std::vector<Row> rows;
  if (!answer.is_object() || !answer.contains("holders")) return rows;
  for (const auto& h : answer["holders"]) {
    rows.emplace_back(h.value("node", ""), h.value("blocks", 0u), h.value("dram", 0u),
                      h.value("ssd", 0u), h.value("tiers", ""));
  }
  return rows;
}

nlohmann::json Post(const NodeProcess& n, const std::string& body, int* status = nullptr) {
  int st = 0;
  std::string text = n.HttpPost("/api/v1/lookup", body, &st);
  if (status != nullptr) *status = st;
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// A standalone node: a malformed descriptor fails its item (the value is
// not stored), a descriptor naming a key that is not in the put fails the
// request (nothing stored), and described blocks are what a lookup finds.
TEST(DescribedPutTest, BadDescriptorsAreRefusedAndGoodOnesFound) {
  auto node = NodeProcess::Start({"--node-id", "solo"});
  ASSERT_NE(node, nullptr);
  kvpool_client* c = OpenLocal(*node, /*copy_mode=*/false);
  ASSERT_NE(c, nullptr);
  auto ids = NumberedKeys("desc", "k", 3);
  std::vector<uint8_t> v(4096, 1);
  const void* vals[3] = {v.data(), v.data(), v.data()};
  const uint64_t sizes[3] = {v.size(), v.size(), v.size()};
  const std::string good0 = Descriptor(0), good1 = Descriptor(1);
  std::string bad = Descriptor(2);
  bad[bad.size() - 1] = 7;  // spec_kind's length byte says 7 bytes that are not there
  kvpool_descriptor descs[3] = {
      {good0.data(), good0.size()}, {bad.data(), bad.size()}, {good1.data(), good1.size()}};
  for (bool copy : {false, true}) {  // reserve+commit, and the copy-mode put
    kvpool_client* cl = copy ? OpenLocal(*node, true) : c;
    auto ids_here = NumberedKeys(copy ? "desc-copy" : "desc", "k", 3);
    kvpool_status st[3] = {-1, -1, -1};
    EXPECT_EQ(kvpool_put_described(cl, ids_here.data(), vals, sizes, descs, 3, st),
              KVPOOL_INVALID_ARGUMENT);
    EXPECT_EQ(st[0], KVPOOL_OK);
    EXPECT_EQ(st[1], KVPOOL_INVALID_ARGUMENT);
    EXPECT_EQ(st[2], KVPOOL_OK);
    uint8_t hits[3] = {9, 9, 9};
    ASSERT_EQ(kvpool_exists(cl, ids_here.data(), 3, hits, nullptr), KVPOOL_OK);
    EXPECT_EQ(hits[0], 1);
    EXPECT_EQ(hits[1], 0) << "a value whose descriptor was refused must not be stored";
    EXPECT_EQ(hits[2], 1);
    if (copy) kvpool_close(cl);
  }
  EXPECT_EQ(node->Metric("kvpool_descriptors_invalid_total"), 2);
  // A plain put after described ones on the same connection carries no
  // descriptor (none of an earlier request's).
  auto plain = NumberedKeys("desc", "plain", 1);
  kvpool_status pst[1];
  ASSERT_EQ(kvpool_put(c, plain.data(), vals, sizes, 1, pst), KVPOOL_OK);
  // The two good ones (written twice, the second time AlreadyExists) are a
  // prefix of 2 blocks here.
  int status = 0;
  auto a = Post(*node, HashesBody(3), &status);
  ASSERT_EQ(status, 200) << a.dump();
  // The lookup applied what the descriptor table had queued, so its gauge
  // is current: two good ones in each namespace.
  EXPECT_EQ(node->Metric("kvpool_descriptors"), 4);
  EXPECT_EQ(a["longest"], 2);
  EXPECT_EQ(Rows(a), (std::vector<Row>{{"solo", 2, 2, 0, "DD"}}));
  // Removed keys leave the answer: block 0 is held under both namespaces,
  // so it stays until both keys are gone.
  kvpool_status rst[1];
  EXPECT_EQ(kvpool_remove(c, ids.data(), 1, rst), KVPOOL_OK);
  a = Post(*node, HashesBody(3));
  EXPECT_EQ(a["longest"], 2) << a.dump();
  auto copy_ids = NumberedKeys("desc-copy", "k", 1);
  EXPECT_EQ(kvpool_remove(c, copy_ids.data(), 1, rst), KVPOOL_OK);
  a = Post(*node, HashesBody(3));
  EXPECT_EQ(a["longest"], 0) << a.dump();
  EXPECT_TRUE(a["holders"].empty()) << a.dump();
  kvpool_close(c);
}

class PrefixLookupTest : public EtcdClusterTest {
 protected:
  PrefixLookupTest() : EtcdClusterTest("lookup") {}
  void TearDown() override {
    for (kvpool_client* cl : clients_) kvpool_close(cl);
    if (!HasFailure()) return;
    for (NodeProcess* n : {a_.get(), b_.get(), c_.get()}) {
      if (n == nullptr) continue;
      std::string log = n->Log();
      if (log.size() > 4000) log = log.substr(log.size() - 4000);
      std::cerr << "---- node log (tail) ----\n" << log << "\n";
    }
  }
  kvpool_client* Client(const NodeProcess& n) {
    kvpool_client* cl = OpenLocal(n, false);
    if (cl != nullptr) clients_.push_back(cl);
    return cl;
  }
  // What the cluster should answer: each node's own blocks, merged.
  std::vector<Row> Truth(std::initializer_list<NodeProcess*> nodes, int n) {
    std::vector<Row> rows;
    for (NodeProcess* node : nodes) {
      auto own = Rows(Post(*node, HashesBody(n, ", \"local\": true")));
      rows.insert(rows.end(), own.begin(), own.end());
    }
    std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
      return std::get<1>(x) != std::get<1>(y) ? std::get<1>(x) > std::get<1>(y)
                                              : std::get<0>(x) < std::get<0>(y);
    });
    return rows;
  }

  std::unique_ptr<NodeProcess> a_, b_, c_;
  std::vector<kvpool_client*> clients_;
  TempDir ssd_dir_;
};

TEST_F(PrefixLookupTest, ThreeNodesAnswerWhatTheirHoldersHoldAndADeadNodeLeaves) {
  // a: 32 MiB of DRAM over an SSD tier, 100 blocks of 512 KiB: the older
  // ones end up on SSD. b: blocks 0..63. c: blocks 0..127 but 40, two keys
  // (TP ranks) a block.
  auto a_args = Args("a");
  auto ssd = SsdArgs(ssd_dir_.path(), "32MiB", "256MiB", "1MiB", {"--eviction", "lru"});
  a_args.insert(a_args.end(), ssd.begin(), ssd.end());
  a_ = StartNodeWith(a_args);
  b_ = StartNodeWith(Args("b"));
  c_ = StartNodeWith(Args("c"));
  ASSERT_TRUE(a_ && b_ && c_);
  ASSERT_TRUE(WaitFor(milliseconds(10000), [&] {
    return Members(*a_).size() == 3 && Members(*b_).size() == 3 && Members(*c_).size() == 3;
  }));
  std::vector<int> a_blocks, b_blocks, c_blocks;
  for (int i = 0; i < 100; ++i) a_blocks.push_back(i);
  for (int i = 0; i < 64; ++i) b_blocks.push_back(i);
  for (int i = 0; i < 128; ++i) {
    if (i != 40) c_blocks.push_back(i);
  }
  ASSERT_NO_FATAL_FAILURE(PutBlocks(Client(*a_), "lookup", a_blocks, 1, 512 << 10));
  ASSERT_NO_FATAL_FAILURE(PutBlocks(Client(*b_), "lookup", b_blocks, 1, 64 << 10));
  ASSERT_NO_FATAL_FAILURE(PutBlocks(Client(*c_), "lookup", c_blocks, 2, 16 << 10));
  ASSERT_EQ(kvpool_flush(Client(*a_)), KVPOOL_OK);

  const std::vector<Row> truth = Truth({a_.get(), b_.get(), c_.get()}, 128);
  ASSERT_EQ(truth.size(), 3u);
  // What was written: a holds 100 blocks, some in DRAM and some only on
  // SSD (as many in DRAM as its DRAM tier has entries); b 64 in DRAM; c 40.
  EXPECT_EQ(std::get<0>(truth[0]), "a");
  EXPECT_EQ(std::get<1>(truth[0]), 100u);
  EXPECT_GT(std::get<2>(truth[0]), 0u);
  EXPECT_GT(std::get<3>(truth[0]), 0u);
  EXPECT_EQ(std::get<2>(truth[0]), DramEntries(*a_));
  EXPECT_EQ(truth[1], (Row{"b", 64, 64, 0, std::string(64, 'D')}));
  EXPECT_EQ(truth[2], (Row{"c", 40, 40, 0, std::string(40, 'D')}));

  // Every node answers for the cluster, and its answer is the truth.
  for (NodeProcess* asked : {a_.get(), b_.get(), c_.get()}) {
    nlohmann::json got;
    EXPECT_TRUE(WaitFor(milliseconds(5000),
                        [&] {
                          got = Post(*asked, HashesBody(128));
                          return Rows(got) == truth;
                        }))
        << "asked " << Rows(got).size() << " holders: " << got.dump();
    EXPECT_EQ(got["longest"], 100);
    EXPECT_EQ(got["blocks"], 128);
    EXPECT_EQ(got["homes_failed"], 0);
  }
  // The C ABI and kvpoolctl give the same answer.
  std::vector<uint64_t> hashes;
  for (int i = 0; i < 128; ++i) hashes.push_back(Hash(i));
  std::string buf(1 << 16, '\0');
  size_t len = 0;
  kvpool_client* cb = Client(*b_);
  ASSERT_NE(cb, nullptr);
  ASSERT_EQ(kvpool_lookup_prefix(cb, hashes.data(), hashes.size(), 0, buf.data(), buf.size(), &len),
            KVPOOL_OK)
      << kvpool_last_error();
  EXPECT_EQ(Rows(nlohmann::json::parse(buf.c_str())), truth);
  std::string out;
  std::vector<std::string> argv = {CtlBinary(), "--socket", b_->socket(), "lookup"};
  for (int i = 0; i < 3; ++i) argv.push_back(std::to_string(Hash(i)));
  EXPECT_EQ(RunCommand(argv, &out), 0) << out;
  EXPECT_NE(out.find("longest 3 of 3 blocks"), std::string::npos) << out;
  EXPECT_NE(out.find("DDD"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({CtlBinary(), "--socket", b_->socket(), "lookup", "0x1234"}, &out), 1)
      << out;
  EXPECT_NE(out.find("longest 0 of 1 blocks"), std::string::npos) << out;

  // One 128-block lookup from b across the three nodes: its latency.
  std::vector<double> us;
  for (int i = 0; i < 500; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(
        kvpool_lookup_prefix(cb, hashes.data(), hashes.size(), 0, buf.data(), buf.size(), &len),
        KVPOOL_OK);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("metric lookup_128_blocks_3_nodes_p50_us %.1f\n", us[us.size() / 2]);
  std::printf("metric lookup_128_blocks_3_nodes_p99_us %.1f\n", us[us.size() * 99 / 100]);

  // c dies: within its lease (2 s) it is gone from every answer.
  const auto killed = std::chrono::steady_clock::now();
  c_->Stop(9);
  const std::vector<Row> without_c = {truth[0], truth[1]};
  for (NodeProcess* asked : {a_.get(), b_.get()}) {
    EXPECT_TRUE(WaitFor(milliseconds(2000 + 3000),
                        [&] { return Rows(Post(*asked, HashesBody(128))) == without_c; }));
  }
  std::printf("metric lookup_dead_node_gone_ms %lld\n", static_cast<long long>(MsSince(killed)));
}

// Bad lookups are answered 400 with the reason, counted; the node serves on.
TEST(PrefixLookupInputTest, BadRequestsAre400AndTheNodeServesOn) {
  auto node = NodeProcess::Start({"--node-id", "solo", "--lookup-max-hashes", "64"});
  ASSERT_NE(node, nullptr);
  struct Case {
    std::string body;
    std::string reason;
  };
  std::string many = "{\"hashes\": [";
  for (int i = 0; i < 65; ++i) many += (i ? ",1" : "1");
  many += "]}";
  const std::vector<Case> cases = {
      {"not json", "JSON object"},
      {"[1, 2]", "JSON object"},
      {"{\"hash\": [1]}", "\"hashes\" must be an array"},
      {"{\"hashes\": [1.5]}", "hashes[0] is not"},
      {"{\"hashes\": [\"0xzz\"]}", "hashes[0] is not"},
      {"{\"hashes\": [\"99999999999999999999999\"]}", "hashes[0] is not"},
      {"{\"hashes\": [1], \"timeout_ms\": 0}", "timeout_ms"},
      {"{\"hashes\": [1], \"local\": 1}", "\"local\""},
      {many, "at most 64"},
  };
  for (const Case& k : cases) {
    int status = 0;
    auto j = Post(*node, k.body, &status);
    EXPECT_EQ(status, 400) << k.body;
    EXPECT_NE(j.value("error", "").find(k.reason), std::string::npos) << k.body << " -> " << j;
  }
  EXPECT_EQ(node->Metric("kvpool_lookup_refused_total"), static_cast<double>(cases.size()));
  int status = 0;
  node->HttpGet("/api/v1/lookup", &status);
  EXPECT_EQ(status, 405);
  // Decimal, negative and hex strings are hashes; the node answers on.
  auto j = Post(*node, "{\"hashes\": [\"18\", -1, \"0xffffffffffffffff\", 7]}", &status);
  EXPECT_EQ(status, 200) << j;
  EXPECT_EQ(j["blocks"], 4);
  EXPECT_EQ(j["longest"], 0);
  // Through the C ABI, more hashes than the batch limit: INVALID_ARGUMENT.
  kvpool_client* c = OpenLocal(*node, false);
  ASSERT_NE(c, nullptr);
  std::vector<uint64_t> too_many(5000, 1);
  char buf[256];
  EXPECT_EQ(kvpool_lookup_prefix(c, too_many.data(), too_many.size(), 0, buf, sizeof(buf), nullptr),
            KVPOOL_INVALID_ARGUMENT);
  uint64_t one = 1;
  EXPECT_EQ(kvpool_lookup_prefix(c, &one, 1, 0, buf, sizeof(buf), nullptr), KVPOOL_OK)
      << kvpool_last_error();
  kvpool_close(c);
}

}  // namespace
}  // namespace kvpool::testing
