// Remote mode of libkvpool against real nodes: three kvpool-node processes
// in a static --peers cluster (UCX on loopback) and a client that has no
// node socket, only the nodes' peer addresses (kvpool_options.remote_peers).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "harness/cluster_harness.h"
#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "peer/peer_messages_format.h"

namespace kvpool::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Polling step of this suite's waits.
constexpr milliseconds kPoll(20);

// A kvpool_client plus the batch helpers the tests need.
class Conn {
 public:
  // Remote mode when remote_peers is non-empty, else the node's local socket.
  static std::unique_ptr<Conn> Remote(const std::string& peers, uint32_t timeout_ms,
                                      kvpool_status* st) {
    kvpool_options o;
    kvpool_options_init(&o);
    o.remote_peers = peers.c_str();
    o.timeout_ms = timeout_ms;
    kvpool_client* c = kvpool_open(&o, st);
    return c == nullptr ? nullptr : std::unique_ptr<Conn>(new Conn(c));
  }
  static std::unique_ptr<Conn> Local(const NodeProcess& n) {
    kvpool_client* c = OpenLocal(n, /*copy_mode=*/false);
    return c == nullptr ? nullptr : std::unique_ptr<Conn>(new Conn(c));
  }
  ~Conn() { kvpool_close(c_); }
  kvpool_client* get() const { return c_; }

  kvpool_status Put(const std::vector<kvpool_key_id>& ids,
                    const std::vector<std::vector<uint8_t>>& vals,
                    std::vector<kvpool_status>* st) {
    st->assign(ids.size(), -1);
    return PutValues(c_, ids, vals, st);
  }
  void PutOk(const std::vector<kvpool_key_id>& ids, const std::vector<std::vector<uint8_t>>& vals) {
    std::vector<kvpool_status> st;
    ASSERT_EQ(Put(ids, vals, &st), KVPOOL_OK) << kvpool_last_error();
    for (auto s : st) EXPECT_EQ(s, KVPOOL_OK);
  }

  // Per key: the value, or nullopt on a miss. Buffers of `cap` bytes.
  std::vector<std::optional<std::vector<uint8_t>>> Get(const std::vector<kvpool_key_id>& ids,
                                                       size_t cap = 4u << 20) {
    return GetValues(c_, ids, cap);
  }

  std::vector<uint8_t> Exists(const std::vector<kvpool_key_id>& ids, size_t* prefix) {
    std::vector<uint8_t> hits(ids.size(), 7);
    EXPECT_EQ(kvpool_exists(c_, ids.data(), ids.size(), hits.data(), prefix), KVPOOL_OK)
        << kvpool_last_error();
    return hits;
  }
  size_t ExistsCount(const std::vector<kvpool_key_id>& ids) {
    size_t prefix = 0, n = 0;
    for (uint8_t h : Exists(ids, &prefix)) n += h;
    return n;
  }

 private:
  explicit Conn(kvpool_client* c) : c_(c) {}
  kvpool_client* c_;
};

std::vector<kvpool_key_id> Keys(const std::string& prefix, size_t n) {
  return NumberedKeys("remote-it", prefix, n);
}

// Sizes from 1 KiB to 4 MiB.
std::vector<std::vector<uint8_t>> Values(uint64_t seed, size_t n) {
  std::vector<std::vector<uint8_t>> v;
  for (size_t i = 0; i < n; ++i) {
    size_t size = i == 0 ? 1024 : i == 1 ? (4u << 20) : 1024 + (i * 397511) % ((4u << 20) - 1024);
    v.push_back(Pattern(seed + i, size));
  }
  return v;
}

// Three nodes in a static cluster; their peer addresses.
struct Cluster3 {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  std::vector<std::string> addrs;
  std::string peers;  // "host:port,host:port,host:port" for remote_peers

  bool Start() {
    StaticCluster sc;
    bool ok = sc.PickPorts({"a", "b", "c"}) &&
              // Remote-mode clients without a token: the nodes run without the
              // cluster key (cluster_auth_test has the keyed and token cases).
              sc.StartNodes({"a", "b", "c"}, {"--dram-capacity", "128MiB", "--insecure"});
    nodes = std::move(sc.nodes);
    addrs = sc.addrs;
    peers = addrs[0] + "," + addrs[1] + "," + addrs[2];
    return ok;
  }
};

class RemoteClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new Cluster3;
    if (!cluster_->Start()) {
      delete cluster_;
      cluster_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr) << "the cluster did not start"; }

  std::unique_ptr<Conn> Remote(const std::string& peers, uint32_t timeout_ms = 10000) {
    kvpool_status st = -1;
    auto c = Conn::Remote(peers, timeout_ms, &st);
    EXPECT_NE(c, nullptr) << kvpool_status_name(st) << " " << kvpool_last_error();
    return c;
  }

  static Cluster3* cluster_;
};
Cluster3* RemoteClientTest::cluster_ = nullptr;

TEST_F(RemoteClientTest, PutGetExistsAreByteExact) {
  auto rc = Remote(cluster_->peers);
  ASSERT_NE(rc, nullptr);
  auto ids = Keys("rt", 12);
  auto vals = Values(100, ids.size());
  rc->PutOk(ids, vals);
  // A second put of the same keys is fine (the homes hold them already).
  rc->PutOk(ids, vals);
  auto got = rc->Get(ids);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  ASSERT_TRUE(
      WaitFor(milliseconds(3000), [&] { return rc->ExistsCount(ids) == ids.size(); }, kPoll));

  // The values are spread over the homes, not all on one node.
  int holding = 0;
  for (auto& n : cluster_->nodes) holding += DramEntries(*n) > 0 ? 1 : 0;
  EXPECT_GE(holding, 2);

  // A buffer too small: RESOURCE_EXHAUSTED with the size needed.
  std::vector<uint8_t> small(100);
  void* ptr = small.data();
  uint64_t cap = small.size(), size = 0;
  kvpool_status st = -1;
  EXPECT_EQ(kvpool_get(rc->get(), &ids[1], &ptr, &cap, 1, &size, &st), KVPOOL_OK);
  EXPECT_EQ(st, KVPOOL_RESOURCE_EXHAUSTED);
  EXPECT_EQ(size, vals[1].size());

  // A miss.
  auto miss = Keys("never-put", 3);
  for (const auto& g : rc->Get(miss)) EXPECT_FALSE(g.has_value());
  EXPECT_EQ(rc->ExistsCount(miss), 0u);
}

TEST_F(RemoteClientTest, RemoteAndLocalClientsSeeEachOthersValues) {
  auto rc = Remote(cluster_->peers);
  ASSERT_NE(rc, nullptr);
  // Remote put, local get on every node.
  auto ids = Keys("r2l", 6);
  auto vals = Values(200, ids.size());
  rc->PutOk(ids, vals);
  for (auto& n : cluster_->nodes) {
    auto local = Conn::Local(*n);
    ASSERT_NE(local, nullptr);
    ASSERT_TRUE(
        WaitFor(milliseconds(3000), [&] { return local->ExistsCount(ids) == ids.size(); }, kPoll));
    auto got = local->Get(ids);
    ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
  }
  // Local put on b (kept on b, published to the homes), remote get.
  auto ids2 = Keys("l2r", 6);
  auto vals2 = Values(300, ids2.size());
  {
    auto local = Conn::Local(*cluster_->nodes[1]);
    ASSERT_NE(local, nullptr);
    local->PutOk(ids2, vals2);
  }
  ASSERT_TRUE(
      WaitFor(milliseconds(3000), [&] { return rc->ExistsCount(ids2) == ids2.size(); }, kPoll));
  auto got = rc->Get(ids2);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals2));
}

TEST_F(RemoteClientTest, ExistsReportsHitsAndThePrefix) {
  auto rc = Remote(cluster_->peers);
  ASSERT_NE(rc, nullptr);
  auto ids = Keys("prefix", 10);
  // Keys 0..4 and 7 are put; the prefix is 5.
  std::vector<kvpool_key_id> put_ids;
  for (size_t i : {0, 1, 2, 3, 4, 7}) put_ids.push_back(ids[i]);
  std::vector<std::vector<uint8_t>> vals;
  for (size_t i = 0; i < put_ids.size(); ++i) vals.push_back(Pattern(400 + i, 2048));
  rc->PutOk(put_ids, vals);
  ASSERT_TRUE(
      WaitFor(milliseconds(3000), [&] { return rc->ExistsCount(ids) == put_ids.size(); }, kPoll));
  size_t prefix = 99;
  auto hits = rc->Exists(ids, &prefix);
  EXPECT_EQ(prefix, 5u);
  EXPECT_EQ(hits, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 0, 1, 0, 0}));
  // Outputs may be NULL.
  EXPECT_EQ(kvpool_exists(rc->get(), ids.data(), ids.size(), nullptr, nullptr), KVPOOL_OK);
}

TEST_F(RemoteClientTest, ADeadEntryInThePeerListIsSkipped) {
  auto rc = Remote(LoopbackAddr(FreePort()) + "," + cluster_->addrs[2], 5000);
  ASSERT_NE(rc, nullptr);
  auto ids = Keys("dead-entry", 4);
  auto vals = Values(500, ids.size());
  rc->PutOk(ids, vals);
  auto got = rc->Get(ids);
  ASSERT_NO_FATAL_FAILURE(ExpectValues(got, vals));
}

TEST_F(RemoteClientTest, ZeroCopyAndNodeOnlyCallsAreFailedPrecondition) {
  auto rc = Remote(cluster_->peers);
  ASSERT_NE(rc, nullptr);
  auto ids = Keys("zc", 1);
  uint64_t size = 64;
  kvpool_region region{};
  kvpool_status st = -1;
  EXPECT_EQ(kvpool_reserve(rc->get(), ids.data(), &size, 1, &region, &st),
            KVPOOL_FAILED_PRECONDITION);
  EXPECT_EQ(kvpool_acquire(rc->get(), ids.data(), 1, &region, &st), KVPOOL_FAILED_PRECONDITION);
  EXPECT_EQ(kvpool_remove(rc->get(), ids.data(), 1, &st), KVPOOL_FAILED_PRECONDITION);
  EXPECT_EQ(kvpool_flush(rc->get()), KVPOOL_FAILED_PRECONDITION);
  EXPECT_NE(std::string(kvpool_last_error()).find("remote mode"), std::string::npos);
  EXPECT_EQ(kvpool_max_value_size(rc->get()), 64ull << 20);
  // Bad input: an empty value is refused per item.
  std::vector<uint8_t> v(1);
  const void* p = v.data();
  uint64_t zero = 0;
  EXPECT_EQ(kvpool_put(rc->get(), ids.data(), &p, &zero, 1, &st), KVPOOL_INVALID_ARGUMENT);
  EXPECT_EQ(st, KVPOOL_INVALID_ARGUMENT);
}

TEST(RemoteClientOpenTest, MalformedOrDeadPeerListsFail) {
  kvpool_status st = -1;
  EXPECT_EQ(Conn::Remote("no-port", 1000, &st), nullptr);
  EXPECT_EQ(st, KVPOOL_INVALID_ARGUMENT);
  auto start = steady_clock::now();
  EXPECT_EQ(Conn::Remote(LoopbackAddr(FreePort()) + "," + LoopbackAddr(FreePort()), 2000, &st),
            nullptr);
  EXPECT_EQ(st, KVPOOL_UNAVAILABLE) << kvpool_last_error();
  EXPECT_LT(steady_clock::now() - start, milliseconds(2000 + 1000));
}

TEST(RemoteClientDownTest, AllNodesDownIsUnavailableWithinTheDeadline) {
  Cluster3 c;
  ASSERT_TRUE(c.Start());
  kvpool_status st = -1;
  const uint32_t timeout_ms = 2000;
  auto rc = Conn::Remote(c.peers, timeout_ms, &st);
  ASSERT_NE(rc, nullptr) << kvpool_last_error();
  auto ids = Keys("down", 8);
  auto vals = Values(600, ids.size());
  for (auto& v : vals) v.resize(std::min<size_t>(v.size(), 64 * 1024));
  rc->PutOk(ids, vals);
  for (auto& n : c.nodes) n->Stop(9);

  auto start = steady_clock::now();
  std::vector<kvpool_status> sts;
  EXPECT_EQ(rc->Put(ids, vals, &sts), KVPOOL_UNAVAILABLE) << kvpool_last_error();
  for (auto s : sts) EXPECT_EQ(s, KVPOOL_UNAVAILABLE);
  EXPECT_LT(steady_clock::now() - start, milliseconds(timeout_ms + 1000));

  start = steady_clock::now();
  std::vector<uint8_t> buf(1 << 16);
  std::vector<void*> ptrs(ids.size(), buf.data());
  std::vector<uint64_t> caps(ids.size(), buf.size()), sizes(ids.size());
  sts.assign(ids.size(), -1);
  EXPECT_EQ(kvpool_get(rc->get(), ids.data(), ptrs.data(), caps.data(), ids.size(), sizes.data(),
                       sts.data()),
            KVPOOL_UNAVAILABLE);
  EXPECT_LT(steady_clock::now() - start, milliseconds(timeout_ms + 1000));

  start = steady_clock::now();
  size_t prefix = 0;
  EXPECT_EQ(kvpool_exists(rc->get(), ids.data(), ids.size(), nullptr, &prefix), KVPOOL_UNAVAILABLE);
  EXPECT_LT(steady_clock::now() - start, milliseconds(timeout_ms + 1000));
}

TEST(MembersMessageTest, RoundTripsAndRejectsMalformedInput) {
  MembershipView v;
  v.epoch = 42;
  v.members = {{"a", "127.0.0.1:1", 7, 1.0, MemberState::kAlive},
               {"b", "10.0.0.2:7000", 0, 2.5, MemberState::kAlive}};
  std::vector<uint8_t> body;
  cluster::EncodeMembersReply(v, &body);
  MembershipView d;
  ASSERT_TRUE(cluster::DecodeMembersReply(body, &d).ok());
  EXPECT_EQ(d.epoch, 42u);
  EXPECT_EQ(d.members, v.members);
  for (size_t cut = 0; cut < body.size(); ++cut) {
    MembershipView t;
    EXPECT_FALSE(cluster::DecodeMembersReply(std::span(body).first(cut), &t).ok()) << cut;
  }
  // A count over the limit is refused before anything is allocated.
  std::vector<uint8_t> huge(12, 0);
  huge[8] = 0xff;
  huge[9] = 0xff;
  huge[10] = 0xff;
  MembershipView t;
  EXPECT_FALSE(cluster::DecodeMembersReply(huge, &t).ok());
}

}  // namespace
}  // namespace kvpool::testing
