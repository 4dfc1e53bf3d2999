// Cache hints against a real kvpool-node over its admin endpoint (POST
// /api/v1/hints): retained keys outlive a flood that takes everything
// else, pins within the budget and refused past it, releases, bad hints
// answered 400 with nothing changed, and the counters.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/cluster_harness.h"

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

}  // namespace
}  // namespace kvpool::testing
