// PeerServer on its own: node A's handlers over its store, directory and
// announcer, called by B, a bare in-process transport that speaks the peer
// messages (peer/peer_messages_format.h) as another node would.
#include "cluster/peer_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "cluster/holdings_announcer.h"
#include "membership/static_membership.h"
#include "peer/peer_messages_format.h"
#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;

std::vector<uint8_t> Bytes(int seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 17 + i * 5);
  return v;
}

class PeerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DramOptions d;
    d.capacity_bytes = 16u << 20;
    d.slab_bytes = 1u << 20;
    d.max_value_bytes = 1u << 20;
    d.huge_pages = false;
    d.prefault = false;
    auto tiered = TieredStore::Open(d, nullptr, &pool_, &pool_, TieringOptions{}, &metrics_);
    ASSERT_TRUE(tiered.ok()) << tiered.status().ToString();
    store_ = std::move(tiered).value();
    std::vector<Member> members = {{"a", "a:1", 0, 1.0}, {"b", "b:1", 0, 1.0}};
    auto membership = StaticMembership::Open({"a", 1, members}, &metrics_);
    ASSERT_TRUE(membership.ok());
    cluster_ = Cluster::Assemble("a", net_.AddNode("a:1"), std::move(membership).value());
    directory_ = std::make_unique<Directory>(DirectoryOptions{}, &metrics_);
    HoldingsAnnouncerOptions ao;
    ao.publish_interval = milliseconds(0);  // flushed by hand
    announcer_ = std::make_unique<HoldingsAnnouncer>(ao, cluster_.get(), directory_.get(),
                                                     store_.get(), &pool_, &metrics_);
    server_ = std::make_unique<PeerServer>(cluster_.get(), directory_.get(), announcer_.get(),
                                           store_.get(), &pool_);
    announcer_->Start();
    b_ = net_.AddNode("b:1");
  }
  void TearDown() override {
    announcer_->Stop();
    pool_.Stop();
    b_.reset();
    cluster_.reset();
    server_.reset();
    announcer_.reset();
    directory_.reset();
  }

  // One call from B to A.
  transport::Reply Call(transport::MessageType type, std::span<const uint8_t> request,
                        std::span<const uint8_t> payload = {}, std::span<uint8_t> sink = {}) {
    transport::CallArgs args;
    args.peer = "a:1";
    args.type = type;
    args.request = request;
    args.payload = payload;
    args.sink = sink;
    args.deadline = transport::SteadyClock::now() + milliseconds(5000);
    return b_->CallSync(args);
  }
  // A key named after `name` whose home is A.
  KeyId HomedOnA(const std::string& name) {
    for (int i = 0;; ++i) {
      KeyId key = MakeKeyId("ps", name + "-" + std::to_string(i));
      if (cluster_->shard_map()->HomeOf(key)->node_id == "a") return key;
    }
  }
  void Put(const KeyId& key, const std::vector<uint8_t>& value) {
    ASSERT_TRUE(store_->Put(key, value, TieredStore::PutPlace{}).ok());
  }

  MetricsRegistry metrics_;
  ThreadPool pool_{2, "test-peer"};
  std::unique_ptr<TieredStore> store_;
  transport::InProcessNetwork net_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Directory> directory_;
  std::unique_ptr<HoldingsAnnouncer> announcer_;
  std::unique_ptr<PeerServer> server_;
  std::unique_ptr<transport::Transport> b_;
};

TEST_F(PeerServerTest, AFetchAnswersTheHeldBytesAMissAndAValueLargerThanAsked) {
  const KeyId key = MakeKeyId("ps", "held");
  const auto value = Bytes(1, 5000);
  Put(key, value);
  std::vector<uint8_t> req;
  EncodeFetch(key, 8192, &req);
  std::vector<uint8_t> sink(8192);
  transport::Reply r = Call(kPeerFetch, req, {}, sink);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  uint64_t size = 0;
  ASSERT_TRUE(DecodeFetchReply(r.header, &size).ok());
  ASSERT_EQ(size, value.size());
  EXPECT_EQ(std::vector<uint8_t>(sink.begin(), sink.begin() + size), value);

  EncodeFetch(MakeKeyId("ps", "never"), 8192, &(req = {}));
  EXPECT_EQ(Call(kPeerFetch, req, {}, sink).status.code(), StatusCode::kNotFound);
  EncodeFetch(key, 4999, &(req = {}));
  EXPECT_EQ(Call(kPeerFetch, req, {}, sink).status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->GetDramStats().pinned, 0u);  // every answer let its pin go
}

TEST_F(PeerServerTest, AStoreIsHeldAndListedBeforeItsAnswerAndAWrongSizeIsRefused) {
  const KeyId key = HomedOnA("placed");
  const auto value = Bytes(2, 3000);
  std::vector<uint8_t> req;
  EncodeStore(key, value.size(), nullptr, 0, &req);
  // A payload of another size than the header says: refused, nothing held.
  EXPECT_EQ(Call(kPeerStore, req, std::span<const uint8_t>(value).first(2999)).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(store_->Contains(key));
  ASSERT_TRUE(Call(kPeerStore, req, value).status.ok());
  auto pin = store_->Acquire(key);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(std::vector<uint8_t>(pin->bytes().begin(), pin->bytes().end()), value);
  pin->Reset();
  // A placed value is published before the answer: A, its home, lists
  // itself at once (no flush), and a lookup at A finds it.
  std::vector<uint8_t> lookup;
  EncodeLookup(std::span<const KeyId>(&key, 1), &lookup);
  transport::Reply lr = Call(kPeerLookup, {}, lookup);
  ASSERT_TRUE(lr.status.ok());
  std::vector<LookupResult> results;
  ASSERT_TRUE(DecodeLookupReply(lr.payload, 1, &results).ok());
  EXPECT_EQ(results[0].holders, (std::vector<HolderRef>{{"a", 1}}));
  EXPECT_EQ(results[0].size, value.size());
  // Stored again: already held, which is all the writer asks.
  EXPECT_TRUE(Call(kPeerStore, req, value).status.ok());
}

TEST_F(PeerServerTest, APublishIsAppliedAndALookupAnswersIt) {
  const KeyId key = HomedOnA("listed");  // B publishes a key to its home
  PublishBatch batch{"b", 1, {{key, PublishOp::kAdd, 4096}}};
  std::vector<uint8_t> payload;
  EncodePublish(batch, &payload);
  ASSERT_TRUE(Call(kPeerPublish, {}, payload).status.ok());
  EXPECT_EQ(directory_->entries(), 1u);
  std::vector<uint8_t> lookup;
  EncodeLookup(std::span<const KeyId>(&key, 1), &lookup);
  transport::Reply r = Call(kPeerLookup, {}, lookup);
  ASSERT_TRUE(r.status.ok());
  std::vector<LookupResult> results;
  ASSERT_TRUE(DecodeLookupReply(r.payload, 1, &results).ok());
  EXPECT_EQ(results[0].size, 4096u);
  EXPECT_EQ(results[0].holders, (std::vector<HolderRef>{{"b", 1}}));
  // And the removal.
  batch.items[0].op = PublishOp::kRemove;
  EncodePublish(batch, &(payload = {}));
  ASSERT_TRUE(Call(kPeerPublish, {}, payload).status.ok());
  EXPECT_EQ(directory_->entries(), 0u);
}

TEST_F(PeerServerTest, MalformedRequestsAreRefusedAndChangeNothing) {
  const KeyId key = MakeKeyId("ps", "kept");
  const auto value = Bytes(3, 1000);
  Put(key, value);
  announcer_->Flush();
  const uint64_t entries = directory_->entries();
  const std::vector<uint8_t> junk = {0xff, 0xff, 0xff, 0xff, 1, 2, 3};
  const std::vector<uint8_t> empty;
  for (transport::MessageType type : {kPeerPublish, kPeerLookup}) {
    EXPECT_EQ(Call(type, {}, junk).status.code(), StatusCode::kInvalidArgument) << type;
    EXPECT_EQ(Call(type, {}, empty).status.code(), StatusCode::kInvalidArgument) << type;
  }
  for (transport::MessageType type : {kPeerFetch, kPeerStore}) {
    EXPECT_EQ(Call(type, junk, junk).status.code(), StatusCode::kInvalidArgument) << type;
    EXPECT_EQ(Call(type, empty).status.code(), StatusCode::kInvalidArgument) << type;
  }
  EXPECT_EQ(directory_->entries(), entries);
  EXPECT_EQ(store_->GetDramStats().entries, 1u);
  auto pin = store_->Acquire(key);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(std::vector<uint8_t>(pin->bytes().begin(), pin->bytes().end()), value);
}

}  // namespace
}  // namespace kvpool::cluster
