// Cache hints against a real kvpool-node over its admin endpoint (POST
// /api/v1/hints): retained keys outlive a flood that takes everything
// else, pins within the budget and refused past it, releases, bad hints
// answered 400 with nothing changed, and the counters; on a node with an
// SSD tier, demotes to SSD and prefetches back, byte-exact.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/cluster_harness.h"
#include "ssd_test_util.h"

namespace kvpool::testing {
namespace {

constexpr size_t kValue = 64 * 1024;  // 16 MiB of 64 KiB values: 256 entries

std::string Body(const std::string& op, int from, int to, const std::string& extra = "") {
  std::string b = "{\"op\": \"" + op + "\", \"namespace\": \"hints\", \"keys\": [";
  for (int i = from; i < to; ++i) b += (i > from ? ",\"k" : "\"k") + std::to_string(i) + "\"";
  return b + "]" + extra + "}";
}

class HintsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = NodeProcess::Start({"--dram-capacity", "16MiB", "--slab-size", "1MiB", "--eviction",
                                "lru", "--pin-max-bytes", "128KiB", "--hint-max-ttl", "1h"});
    ASSERT_NE(node_, nullptr);
    c_ = OpenLocal(*node_, /*copy_mode=*/true);
    ASSERT_NE(c_, nullptr);
  }
  void TearDown() override {
    if (c_ != nullptr) kvpool_close(c_);
  }
  // Puts keys k<from>..k<to-1> of 64 KiB.
  void PutRange(int from, int to) {
    auto ids = NumberedKeys("hints", "k", static_cast<size_t>(to));
    std::vector<kvpool_key_id> part(ids.begin() + from, ids.end());
    ByteValues vals(part.size(), std::vector<uint8_t>(kValue, 0x5a));
    std::vector<kvpool_status> st(part.size(), -1);
    ASSERT_EQ(PutValues(c_, part, vals, &st), KVPOOL_OK);
  }
  std::string Present(const std::vector<int>& ks) {
    auto ids = NumberedKeys("hints", "k", 3000);
    std::string out;
    for (int k : ks) {
      uint8_t hit = 9;
      EXPECT_EQ(kvpool_exists(c_, &ids[static_cast<size_t>(k)], 1, &hit, nullptr), KVPOOL_OK);
      out += hit ? '1' : '0';
    }
    return out;
  }
  nlohmann::json Post(const std::string& body, int* status) {
    return nlohmann::json::parse(node_->HttpPost("/api/v1/hints", body, status), nullptr, false);
  }

  std::unique_ptr<NodeProcess> node_;
  kvpool_client* c_ = nullptr;
};

TEST_F(HintsTest, RetainPinAndReleaseOverHttp) {
  PutRange(0, 256);
  int status = 0;
  // Retain k0..k3 (and two keys never put: counted unknown).
  auto a = Post(Body("retain", 0, 4, ", \"ttl_s\": 600, \"priority\": 3"), &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(a["applied"], 4);
  a = Post(Body("retain", 2998, 3000, ", \"ttl_s\": 600"), &status);
  EXPECT_EQ(a["unknown"], 2);
  // Pin k4 and k5: 128 KiB, the whole budget.
  a = Post(Body("pin", 4, 6, ", \"ttl_s\": 600"), &status);
  EXPECT_EQ(status, 200) << a.dump();
  EXPECT_EQ(a["applied"], 2);
  // One byte more is past it: refused, k6 not pinned.
  a = Post(Body("pin", 6, 7, ", \"ttl_s\": 600"), &status);
  EXPECT_EQ(status, 429);
  EXPECT_NE(a.value("error", "").find("pin budget"), std::string::npos) << a.dump();
  // A flood of 400 new keys: everything else goes, the hinted keys stay.
  PutRange(1000, 1400);
  EXPECT_EQ(Present({0, 1, 2, 3, 4, 5, 6, 7, 255}), "111111000");
  EXPECT_EQ(node_->Metric("kvpool_hints_total{op=\"retain\"}"), 2);
  EXPECT_EQ(node_->Metric("kvpool_hints_total{op=\"pin\"}"), 1);
  EXPECT_EQ(node_->Metric("kvpool_hints_refused_total{reason=\"pin_budget\"}"), 1);
  EXPECT_EQ(node_->Metric("kvpool_hint_unknown_keys_total"), 2);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_retained_bytes{tenant=\"default\"}"), 4 * kValue);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_hint_pinned_bytes{tenant=\"default\"}"), 2 * kValue);
  // Released, k0 and k4 go back to LRU order and the next flood takes them.
  a = Post(Body("release", 0, 1), &status);
  EXPECT_EQ(status, 200);
  a = Post(Body("release", 4, 5), &status);
  EXPECT_EQ(status, 200);
  PutRange(1400, 1700);
  EXPECT_EQ(Present({0, 1, 2, 3, 4, 5}), "011101");
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_hint_pinned_bytes{tenant=\"default\"}"), kValue);

  // kvpoolctl: the same hints from the command line.
  const std::string admin = "127.0.0.1:" + std::to_string(node_->admin_port());
  std::string out;
  EXPECT_EQ(
      RunCommand({CtlBinary(), "pin", "hints", "k1699", "k1698", "--ttl", "60s", "--admin", admin},
                 &out, /*merge_stderr=*/true),
      3);
  EXPECT_NE(out.find("pin refused (HTTP 429): dram: pins would hold 196608 bytes"),
            std::string::npos)
      << out;
  EXPECT_EQ(RunCommand({CtlBinary(), "retain", "hints", "k1699", "k0", "--ttl", "10m", "--priority",
                        "7", "--admin", admin},
                       &out, true),
            0);
  EXPECT_EQ(out, "applied 1, not in DRAM 1\n");
  EXPECT_EQ(
      RunCommand({CtlBinary(), "release", "hints", "k1699", "k5", "--admin", admin}, &out, true),
      0);
  EXPECT_EQ(out, "applied 2, not in DRAM 0\n");
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_hint_pinned_bytes{tenant=\"default\"}"), 0);
  EXPECT_EQ(RunCommand({CtlBinary(), "retain", "hints", "k1", "--admin", admin}, &out, true), 2);
}

TEST_F(HintsTest, BadHintsAreRefusedAndChangeNothing) {
  PutRange(0, 4);
  int status = 0;
  for (const std::string& body :
       {std::string("not json"), std::string("[]"), std::string("{\"op\": \"keep\"}"),
        Body("retain", 0, 2),                    // no ttl
        Body("retain", 0, 2, ", \"ttl_s\": 0"),  // a ttl of 0
        Body("pin", 0, 2, ", \"ttl_s\": 3601"),  // past --hint-max-ttl
        Body("retain", 0, 2, ", \"ttl_s\": 1, \"priority\": 256"),
        Body("retain", 0, 2, ", \"ttl_s\": 1, \"tenant\": \"nobody\""),
        Body("retain", 0, 8193, ", \"ttl_s\": 1"),  // more keys than a hint may name
        std::string(
            "{\"op\": \"retain\", \"namespace\": \"hints\", \"keys\": [1], \"ttl_s\": 1}")}) {
    auto a = Post(body, &status);
    EXPECT_TRUE(status == 400 || status == 404) << body << " -> " << status;
    EXPECT_TRUE(a.contains("error")) << body;
  }
  EXPECT_EQ(node_->Metric("kvpool_hints_refused_total{reason=\"bad_request\"}"), 5);
  EXPECT_EQ(node_->Metric("kvpool_hints_refused_total{reason=\"bad_ttl\"}"), 3);
  EXPECT_EQ(node_->Metric("kvpool_hints_refused_total{reason=\"unknown_tenant\"}"), 1);
  EXPECT_EQ(node_->Metric("kvpool_hints_refused_total{reason=\"too_many_keys\"}"), 1);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_retained_bytes{tenant=\"default\"}"), 0);
  // Still serving, every byte as put.
  auto got = GetValues(c_, NumberedKeys("hints", "k", 4), kValue);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& v : got) {
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, std::vector<uint8_t>(kValue, 0x5a));
  }
}

// Demote moves keys from DRAM to the SSD tier (still held); prefetch brings
// them back, answered once they are in DRAM; the next get of each is a
// DRAM hit (no promotion) counted as a prefetch hit, and every
// value is byte-exact throughout. Negative control: the keys not
// prefetched are still promoted by their gets.
TEST(HintsSsdTest, DemoteAndPrefetchMoveKeysBetweenTiers) {
  TempDir tmp;
  auto node = NodeProcess::Start(SsdArgs(tmp.path() + "/ssd", "16MiB", "64MiB", "1MiB"));
  ASSERT_NE(node, nullptr);
  kvpool_client* c = OpenLocal(*node, /*copy_mode=*/true);
  ASSERT_NE(c, nullptr);
  auto ids = NumberedKeys("hints", "k", 8);
  ByteValues vals;
  for (int i = 0; i < 8; ++i) vals.emplace_back(kValue, static_cast<uint8_t>(0x30 + i));
  std::vector<kvpool_status> st(ids.size(), -1);
  ASSERT_EQ(PutValues(c, ids, vals, &st), KVPOOL_OK);
  auto check_all = [&] {
    auto got = GetValues(c, ids, kValue);
    ASSERT_EQ(got.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(*got[i], vals[i]) << i;
    }
  };
  int status = 0;
  auto post = [&](const std::string& body) {
    return nlohmann::json::parse(node->HttpPost("/api/v1/hints", body, &status), nullptr, false);
  };
  const std::string dram_entries = "kvpool_tenant_dram_entries{tenant=\"default\"}";
  auto a = post(Body("demote", 0, 6) + "");  // k0..k5
  EXPECT_EQ(status, 200) << a.dump();
  EXPECT_EQ(a["applied"], 6);
  EXPECT_EQ(a["moved"], 6);
  EXPECT_EQ(node->Metric(dram_entries), 2);
  EXPECT_EQ(node->Metric("kvpool_ssd_entries"), 6);
  a = post(Body("prefetch", 0, 4));  // k0..k3
  EXPECT_EQ(status, 200) << a.dump();
  EXPECT_EQ(a["applied"], 4);
  EXPECT_EQ(a["moved"], 4);
  EXPECT_EQ(a["unknown"], 0);
  EXPECT_EQ(node->Metric(dram_entries), 6);
  EXPECT_EQ(node->Metric("kvpool_tenant_dram_prefetched_entries{tenant=\"default\"}"), 4);
  const double promotions = node->Metric("kvpool_tier_promotions_total");
  ASSERT_NO_FATAL_FAILURE(check_all());
  EXPECT_EQ(node->Metric("kvpool_tenant_dram_prefetch_hits{tenant=\"default\"}"), 4);
  EXPECT_EQ(node->Metric("kvpool_tenant_dram_prefetched_entries{tenant=\"default\"}"), 0);
  // Only k4 and k5, not prefetched, were promoted by their gets.
  EXPECT_EQ(node->Metric("kvpool_tier_promotions_total") - promotions, 2);
  EXPECT_EQ(node->Metric("kvpool_hints_total{op=\"demote\"}"), 1);
  EXPECT_EQ(node->Metric("kvpool_hints_total{op=\"prefetch\"}"), 1);

  // kvpoolctl: the same from the command line.
  const std::string admin = "127.0.0.1:" + std::to_string(node->admin_port());
  std::string out;
  EXPECT_EQ(
      RunCommand({CtlBinary(), "demote", "hints", "k6", "k7", "k99", "--admin", admin}, &out, true),
      0);
  EXPECT_EQ(out, "applied 2, not in DRAM 1, moved to SSD 2\n");
  EXPECT_EQ(RunCommand({CtlBinary(), "prefetch", "hints", "k7", "k0", "k99", "--admin", admin},
                       &out, true),
            0);
  EXPECT_EQ(out, "in DRAM 2 (brought in 1), not held 1\n");
  ASSERT_NO_FATAL_FAILURE(check_all());
  kvpool_close(c);
}

// Two nodes of a static cluster: hints sent to a for keys b holds take
// effect on b (pins and retentions in b's store, counted as applied at a);
// a prefetch at a of keys b holds brings copies into a's DRAM, and the
// next get of each at a is a DRAM hit there (no fetch from b), counted as
// a prefetch hit, byte-exact. A pin on b is gone once b restarts.
TEST(HintsClusterTest, HintsForKeysHeldElsewhereTakeEffectAtTheirHolder) {
  StaticCluster sc;
  sc.PickPorts({"a", "b"});
  const std::vector<std::string> extra = {"--pin-max-bytes", "1MiB", "--read-replicas", "none"};
  ASSERT_TRUE(sc.StartNodes({"a", "b"}, extra));
  NodeProcess* a = sc.nodes[0].get();
  kvpool_client* cb = OpenLocal(*sc.nodes[1], /*copy_mode=*/true);
  kvpool_client* ca = OpenLocal(*a, /*copy_mode=*/true);
  ASSERT_TRUE(ca != nullptr && cb != nullptr);
  auto ids = NumberedKeys("hints", "k", 8);
  ByteValues vals;
  for (int i = 0; i < 8; ++i) vals.push_back(Pattern(900 + i, kValue));
  std::vector<kvpool_status> st(ids.size(), -1);
  ASSERT_EQ(PutValues(cb, ids, vals, &st), KVPOOL_OK);
  ASSERT_TRUE(WaitFor(std::chrono::milliseconds(5000), [&] {
    std::vector<uint8_t> hits(ids.size());
    size_t prefix = 0;
    return kvpool_exists(ca, ids.data(), ids.size(), hits.data(), &prefix) == KVPOOL_OK &&
           prefix == ids.size();
  }));
  const std::string def = "{tenant=\"default\"}";
  int status = 0;
  auto post = [&](const std::string& body) {
    return nlohmann::json::parse(a->HttpPost("/api/v1/hints", body, &status), nullptr, false);
  };
  auto h = post(Body("pin", 0, 2, ", \"ttl_s\": 600"));
  EXPECT_EQ(status, 200) << h.dump();
  EXPECT_EQ(h["applied"], 2);
  EXPECT_EQ(h["unknown"], 0);
  EXPECT_EQ(sc.nodes[1]->Metric("kvpool_tenant_dram_hint_pinned_bytes" + def), 2 * kValue);
  EXPECT_EQ(a->Metric("kvpool_tenant_dram_hint_pinned_bytes" + def), 0);
  h = post(Body("retain", 2, 3, ", \"ttl_s\": 600"));
  EXPECT_EQ(h["applied"], 1) << h.dump();
  EXPECT_EQ(sc.nodes[1]->Metric("kvpool_tenant_dram_retained_bytes" + def), kValue);
  // A key no node holds stays unknown.
  h = post(
      "{\"op\": \"retain\", \"namespace\": \"hints\", \"keys\": [\"nowhere\"], "
      "\"ttl_s\": 60}");
  EXPECT_EQ(h["applied"], 0) << h.dump();
  EXPECT_EQ(h["unknown"], 1);
  // Past b's pin budget (1 MiB): b refuses, and so does the answer.
  auto big_ids = NumberedKeys("hints", "big", 20);
  ByteValues big(20, std::vector<uint8_t>(kValue, 0x61));
  std::vector<kvpool_status> bst(big_ids.size(), -1);
  ASSERT_EQ(PutValues(cb, big_ids, big, &bst), KVPOOL_OK);
  std::string body = "{\"op\": \"pin\", \"namespace\": \"hints\", \"ttl_s\": 60, \"keys\": [";
  for (int i = 0; i < 20; ++i) body += (i ? ",\"big" : "\"big") + std::to_string(i) + "\"";
  ASSERT_TRUE(WaitFor(std::chrono::milliseconds(5000), [&] {
    std::vector<uint8_t> hits(big_ids.size());
    size_t prefix = 0;
    return kvpool_exists(ca, big_ids.data(), big_ids.size(), hits.data(), &prefix) == KVPOOL_OK &&
           prefix == big_ids.size();
  }));
  h = post(body + "]}");
  EXPECT_EQ(status, 429) << h.dump();
  EXPECT_EQ(sc.nodes[1]->Metric("kvpool_tenant_dram_hint_pinned_bytes" + def), 2 * kValue);

  // Prefetch at a of keys b holds: copies here, read as DRAM hits.
  h = post(Body("prefetch", 4, 7));
  EXPECT_EQ(status, 200) << h.dump();
  EXPECT_EQ(h["applied"], 3);
  EXPECT_EQ(h["moved"], 3);
  EXPECT_EQ(a->Metric("kvpool_tenant_dram_prefetched_entries" + def), 3);
  const double fetched = a->Metric("kvpool_remote_hits_total");
  std::vector<kvpool_key_id> part(ids.begin() + 4, ids.begin() + 7);
  auto got = GetValues(ca, part, kValue);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(*got[i], vals[4 + i]) << i;
  }
  EXPECT_EQ(a->Metric("kvpool_remote_hits_total"), fetched);  // no fetch from b
  EXPECT_EQ(a->Metric("kvpool_tenant_dram_prefetch_hits" + def), 3);
  // Negative control: k7, not prefetched, is fetched from b by its get.
  std::vector<kvpool_key_id> k7 = {ids[7]};
  got = GetValues(ca, k7, kValue);
  ASSERT_TRUE(got[0].has_value());
  EXPECT_EQ(*got[0], vals[7]);
  EXPECT_EQ(a->Metric("kvpool_remote_hits_total"), fetched + 1);

  // b restarts: its pins are gone (leases live in memory).
  kvpool_close(cb);
  sc.nodes[1]->Stop();
  std::vector<std::string> args = {"--node-id", "b",           "--peers",
                                   sc.members,  "--peer-port", std::to_string(sc.ports[1])};
  args.insert(args.end(), extra.begin(), extra.end());
  sc.nodes[1] = NodeProcess::Start(args);
  ASSERT_NE(sc.nodes[1], nullptr);
  EXPECT_EQ(sc.nodes[1]->Metric("kvpool_tenant_dram_hint_pinned_bytes" + def), 0);
  kvpool_close(ca);
}

}  // namespace
}  // namespace kvpool::testing
