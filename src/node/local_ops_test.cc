// LocalOps on its own: the local protocol's operations over a real store,
// fed frames by hand as the local server's loop would (no socket, no
// client library), with the cluster stood in by a fake whose remote reads
// complete when the test says. Each reply frame is decoded and checked.
#include "node/local_ops.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/executor.h"
#include "protocol/codec.h"

namespace kvpool {
namespace {

using protocol::FrameHeader;
using protocol::MessageType;
using protocol::SizedKey;

std::vector<uint8_t> Value(int seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 29 + i * 3);
  return v;
}

KeyId Key(const std::string& name) { return MakeKeyId("ops", name); }

// The cluster as LocalOps sees it. Values "held elsewhere" arrive only when
// the test completes the fetch it recorded; Exists answers from the same
// map at once. Placement calls are recorded; nothing is forwarded.
class FakeCluster final : public RemoteReads, public RemotePlacement {
 public:
  explicit FakeCluster(TieredStore* store) : store_(store) {}
  void Hold(const KeyId& key, std::vector<uint8_t> v) { values_[key] = std::move(v); }

  void Fetch(std::vector<KeyId> keys, FetchDone done) override {
    fetches_.push_back({std::move(keys), std::move(done)});
  }
  // Completes the oldest fetch: what is held elsewhere is copied into the
  // store (a local replica, as RemoteReader does) and pinned.
  void CompleteFetch() {
    ASSERT_FALSE(fetches_.empty());
    auto [keys, done] = std::move(fetches_.front());
    fetches_.erase(fetches_.begin());
    std::vector<TieredStore::Pin> pins;
    for (const KeyId& k : keys) {
      auto it = values_.find(k);
      if (it == values_.end()) continue;
      auto r = store_->Reserve(k, it->second.size());
      ASSERT_TRUE(r.ok());
      std::memcpy(r->data(), it->second.data(), it->second.size());
      auto pin = store_->CommitAndAcquire(std::move(r).value(), WriteOrigin::kCopy);
      ASSERT_TRUE(pin.ok());
      pins.push_back(std::move(pin).value());
    }
    done(std::move(pins));
  }
  size_t fetches() const { return fetches_.size(); }
  std::vector<KeyId> fetched_keys(size_t i) const { return fetches_[i].first; }

  void Exists(std::vector<KeyId> keys, ExistsDone done) override {
    std::vector<KeyId> hits;
    for (const KeyId& k : keys) {
      if (values_.count(k) > 0) hits.push_back(k);
    }
    done(std::move(hits));
  }
  bool EvictedLately(const KeyId&) const override { return false; }

  void NoteChain(const KeyId* before, std::span<const KeyId> keys) override {
    notes.push_back({before != nullptr ? std::optional<KeyId>(*before) : std::nullopt,
                     std::vector<KeyId>(keys.begin(), keys.end())});
  }
  bool Forward(const KeyId&, std::span<const uint8_t>) override { return false; }
  bool WouldForward(const KeyId&) const override { return false; }
  void PublishNow() override { ++publishes; }

  struct Note {
    std::optional<KeyId> before;
    std::vector<KeyId> keys;
  };
  std::vector<Note> notes;
  int publishes = 0;

 private:
  TieredStore* const store_;
  std::map<KeyId, std::vector<uint8_t>> values_;
  std::vector<std::pair<std::vector<KeyId>, FetchDone>> fetches_;
};

// One decoded reply frame.
struct ReplyFrame {
  FrameHeader h;
  std::vector<uint8_t> body;
};

class LocalOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DramOptions d;
    d.capacity_bytes = 16 << 20;
    d.slab_bytes = 1 << 20;
    d.max_value_bytes = 1 << 20;
    d.huge_pages = false;
    d.prefault = false;
    auto store = TieredStore::Open(d, nullptr, &pool_, &pool_, TieringOptions{}, &metrics_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    cluster_ = std::make_unique<FakeCluster>(store_.get());
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ASSERT_GE(wake_fd_, 0);
  }
  void TearDown() override {
    copy_pool_.Stop();
    ops_.reset();
    pool_.Stop();
    if (staging_ != nullptr) ::munmap(staging_, staging_bytes_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }
  // LocalOps over the store; with the fake cluster or standalone; with
  // staging_bytes, each connection gets a staging area of that size and
  // commits copy from it on two copy threads.
  void Open(bool clustered, uint64_t staging_bytes = 0) {
    ClusterFaces faces;
    if (clustered) faces = {cluster_.get(), cluster_.get()};
    LocalServerOptions o;
    o.client_staging_bytes = staging_bytes;
    staging_bytes_ = staging_bytes;
    ops_ = std::make_unique<LocalOps>(o, store_.get(), faces, wake_fd_, &metrics_,
                                      [] { return std::string("{}"); });
    if (staging_bytes > 0) ops_->set_copy_executor(&copy_pool_, 2);
    s_.fd = 7;
    s_.id = 1;
  }

  void Send(MessageType type, const std::vector<uint8_t>& body) {
    FrameHeader h;
    h.type = static_cast<uint16_t>(type);
    h.request_id = ++request_id_;
    h.body_len = static_cast<uint32_t>(body.size());
    ops_->Handle(s_, h, body);
  }
  // The reply frames queued on the session, oldest first, taken off it.
  std::vector<ReplyFrame> Replies() {
    std::vector<ReplyFrame> out;
    while (!s_.out.empty()) {
      std::vector<uint8_t> f = std::move(s_.out.front());
      s_.out.pop_front();
      ReplyFrame r;
      EXPECT_TRUE(protocol::DecodeHeader(f, 1u << 30, &r.h).ok());
      r.body.assign(f.begin() + protocol::kHeaderBytes, f.end());
      out.push_back(std::move(r));
    }
    return out;
  }
  ReplyFrame OneReply() {
    auto r = Replies();
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? ReplyFrame{} : r.front();
  }
  void Hello() {
    std::vector<uint8_t> body;
    protocol::HelloRequest req;
    req.client_name = "ops-test";
    protocol::EncodeHello(req, &body);
    Send(MessageType::kHello, body);
    ReplyFrame r = OneReply();
    ASSERT_EQ(r.h.status, 0);
    ASSERT_TRUE(s_.handshaked);
    if (staging_bytes_ > 0) {
      // The client's writable view of its staging area.
      ASSERT_TRUE(s_.staging != nullptr);
      void* p =
          ::mmap(nullptr, staging_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, s_.staging->fd(), 0);
      ASSERT_NE(p, MAP_FAILED);
      staging_ = static_cast<uint8_t*>(p);
    }
  }
  // Reserves keys of the given sizes and writes Value(seeds[i]) into each
  // one's staging range, as a client does; the handles.
  std::vector<uint64_t> ReserveAndWrite(const std::vector<KeyId>& keys,
                                        const std::vector<size_t>& sizes,
                                        const std::vector<int>& seeds) {
    std::vector<SizedKey> items;
    for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], sizes[i]});
    std::vector<uint8_t> body;
    protocol::EncodeSizedKeys(items, &body);
    Send(MessageType::kReserve, body);
    ReplyFrame r = OneReply();
    std::vector<protocol::RegionItem> regions;
    EXPECT_TRUE(protocol::DecodeRegionItems(r.body, 4096, &regions).ok());
    std::vector<uint64_t> handles;
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(regions[i].status, 0) << i;
      auto v = Value(seeds[i], sizes[i]);
      std::memcpy(staging_ + regions[i].offset, v.data(), v.size());
      handles.push_back(regions[i].handle);
    }
    return handles;
  }
  void SendCommit(const std::vector<uint64_t>& handles) {
    std::vector<uint8_t> body;
    protocol::EncodeHandles(handles, &body);
    Send(MessageType::kCommit, body);
  }
  // Waits (5 s at most) for the loop's wake fd, then takes what is ready.
  std::vector<ParkedReads::Request> WaitReady() {
    pollfd p{wake_fd_, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 5000), 1);
    uint64_t n = 0;
    EXPECT_EQ(::read(wake_fd_, &n, sizeof(n)), static_cast<ssize_t>(sizeof(n)));
    return ops_->TakeReady();
  }
  std::vector<int32_t> Statuses(const ReplyFrame& r) {
    std::vector<int32_t> statuses;
    EXPECT_TRUE(protocol::DecodeStatuses(r.body, 4096, &statuses).ok());
    return statuses;
  }
  // A put of keys with values Value(seeds[i], sizes[i]); its statuses.
  std::vector<int32_t> Put(const std::vector<KeyId>& keys, const std::vector<int>& seeds,
                           size_t size = 4096) {
    std::vector<SizedKey> items;
    std::vector<uint8_t> body;
    for (const KeyId& k : keys) items.push_back({k, size});
    protocol::EncodeSizedKeys(items, &body);
    for (int seed : seeds) {
      auto v = Value(seed, size);
      body.insert(body.end(), v.begin(), v.end());
    }
    Send(MessageType::kPut, body);
    ReplyFrame r = OneReply();
    EXPECT_EQ(r.h.type, static_cast<uint16_t>(MessageType::kPut) | protocol::kReplyBit);
    std::vector<int32_t> statuses;
    EXPECT_TRUE(protocol::DecodeStatuses(r.body, 4096, &statuses).ok());
    return statuses;
  }
  void SendGet(const std::vector<KeyId>& keys, size_t capacity = 4096) {
    std::vector<SizedKey> items;
    for (const KeyId& k : keys) items.push_back({k, capacity});
    std::vector<uint8_t> body;
    protocol::EncodeSizedKeys(items, &body);
    Send(MessageType::kGet, body);
  }
  // Checks a get reply: item i holds Value(seeds[i]) (a seed < 0: a miss).
  void ExpectGetReply(const ReplyFrame& r, const std::vector<int>& seeds, size_t size = 4096) {
    ASSERT_EQ(r.h.type, static_cast<uint16_t>(MessageType::kGet) | protocol::kReplyBit);
    std::vector<protocol::GetItem> items;
    std::span<const uint8_t> data;
    ASSERT_TRUE(protocol::DecodeGetReply(r.body, 4096, &items, &data).ok());
    ASSERT_EQ(items.size(), seeds.size());
    size_t off = 0;
    for (size_t i = 0; i < seeds.size(); ++i) {
      if (seeds[i] < 0) {
        EXPECT_EQ(items[i].status, static_cast<int32_t>(StatusCode::kNotFound)) << i;
        continue;
      }
      ASSERT_EQ(items[i].status, 0) << i;
      ASSERT_EQ(items[i].size, size) << i;
      auto want = Value(seeds[i], size);
      ASSERT_LE(off + size, data.size());
      EXPECT_EQ(std::memcmp(data.data() + off, want.data(), size), 0) << "item " << i;
      off += size;
    }
    EXPECT_EQ(off, data.size());
  }
  double Metric(const std::string& name, const Labels& labels = {}) {
    return metrics_.ValueOf(name, labels);
  }

  MetricsRegistry metrics_;
  ThreadPool pool_{2, "ops-test"};
  ThreadPool copy_pool_{2, "ops-copy"};
  uint64_t staging_bytes_ = 0;
  uint8_t* staging_ = nullptr;  // the client's view
  std::unique_ptr<TieredStore> store_;
  std::unique_ptr<FakeCluster> cluster_;
  int wake_fd_ = -1;
  std::unique_ptr<LocalOps> ops_;
  LocalSession s_;
  uint64_t request_id_ = 0;
};

TEST_F(LocalOpsTest, APutThenAGetAreAnsweredByteExactAndCounted) {
  Open(/*clustered=*/false);
  Hello();
  std::vector<KeyId> keys = {Key("a"), Key("b"), Key("c")};
  EXPECT_EQ(Put(keys, {1, 2, 3}), (std::vector<int32_t>{0, 0, 0}));
  // The same key again: AlreadyExists, the first value kept.
  EXPECT_EQ(Put({Key("b")}, {9}),
            (std::vector<int32_t>{static_cast<int32_t>(StatusCode::kAlreadyExists)}));
  SendGet({Key("a"), Key("nope"), Key("b"), Key("c")});
  ReplyFrame r = OneReply();
  EXPECT_EQ(r.h.request_id, request_id_);
  ExpectGetReply(r, {1, -1, 2, 3});
  EXPECT_FALSE(s_.pending);
  EXPECT_EQ(Metric("kvpool_ops_total", {{"op", "put"}}), 2);
  EXPECT_EQ(Metric("kvpool_ops_total", {{"op", "get"}}), 1);
  EXPECT_EQ(Metric("kvpool_tenant_hits_total", {{"tenant", "default"}}), 3);
  EXPECT_EQ(Metric("kvpool_tenant_misses_total", {{"tenant", "default"}}), 1);
  EXPECT_EQ(Metric("kvpool_tenant_bytes_read_total", {{"tenant", "default"}}), 3 * 4096);
}

TEST_F(LocalOpsTest, AFrameBeforeTheHelloAndAMalformedPutAreRefusedWithNothingStored) {
  Open(/*clustered=*/false);
  Send(MessageType::kPut, {});
  ReplyFrame first = OneReply();
  EXPECT_EQ(first.h.type, static_cast<uint16_t>(MessageType::kError) | protocol::kReplyBit);
  EXPECT_EQ(first.h.status, static_cast<int32_t>(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(s_.closing);
  EXPECT_EQ(Metric("kvpool_protocol_errors_total", {{"reason", "no_handshake"}}), 1);

  s_ = LocalSession{};
  Hello();
  // Two keys of 4096 bytes announced, 4095 sent.
  std::vector<SizedKey> items = {{Key("x"), 4096}, {Key("y"), 4096}};
  std::vector<uint8_t> body;
  protocol::EncodeSizedKeys(items, &body);
  auto v = Value(5, 8191);
  body.insert(body.end(), v.begin(), v.end());
  Send(MessageType::kPut, body);
  ReplyFrame bad = OneReply();
  EXPECT_EQ(bad.h.status, static_cast<int32_t>(StatusCode::kInvalidArgument));
  std::string text;
  ASSERT_TRUE(protocol::DecodeString(bad.body, &text).ok());
  EXPECT_EQ(text, "malformed put: value sizes do not add up to the body");
  EXPECT_EQ(Metric("kvpool_protocol_errors_total", {{"reason", "malformed_body"}}), 1);
  EXPECT_FALSE(s_.closing);
  EXPECT_FALSE(store_->Contains(Key("x")));
  EXPECT_FALSE(store_->Contains(Key("y")));
  // The connection keeps serving.
  EXPECT_EQ(Put({Key("x")}, {5}), (std::vector<int32_t>{0}));
}

// A Hint naming no operation (0, one past the last, one that would read
// as retain if cut to a byte) or a priority over 255 is refused with its
// reason; nothing is retained, and the connection keeps serving.
TEST_F(LocalOpsTest, AHintWithAnUnknownOperationOrPriorityIsRefused) {
  Open(/*clustered=*/false);
  Hello();
  EXPECT_EQ(Put({Key("x")}, {5}), (std::vector<int32_t>{0}));
  for (uint32_t op : {0u, 6u, 257u}) {
    protocol::HintRequest m;
    m.op = op;
    m.ttl_ms = 1000;
    m.keys = {Key("x")};
    std::vector<uint8_t> body;
    protocol::EncodeHint(m, &body);
    Send(MessageType::kHint, body);
    ReplyFrame r = OneReply();
    EXPECT_EQ(r.h.status, static_cast<int32_t>(StatusCode::kInvalidArgument)) << op;
    std::string text;
    ASSERT_TRUE(protocol::DecodeString(r.body, &text).ok());
    EXPECT_EQ(text, "unknown hint operation " + std::to_string(op));
  }
  protocol::HintRequest m;
  m.op = 1;
  m.priority = 256;
  m.ttl_ms = 1000;
  m.keys = {Key("x")};
  std::vector<uint8_t> body;
  protocol::EncodeHint(m, &body);
  Send(MessageType::kHint, body);
  EXPECT_EQ(OneReply().h.status, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_EQ(Metric("kvpool_hints_refused_total", {{"reason", "bad_request"}}), 4);
  EXPECT_EQ(store_->GetDramStats().retained_entries, 0u);
  EXPECT_FALSE(s_.closing);
  EXPECT_EQ(Put({Key("y")}, {6}), (std::vector<int32_t>{0}));
}

// Keys held elsewhere park the get (no reply, later frames wait); the
// fetch's completion wakes the loop's fd and Resume answers from the pins
// the wait took, in the request's order.
TEST_F(LocalOpsTest, AGetOfKeysHeldElsewhereParksAndIsAnsweredOnResume) {
  Open(/*clustered=*/true);
  Hello();
  ASSERT_EQ(Put({Key("here")}, {1}), (std::vector<int32_t>{0}));
  cluster_->Hold(Key("far"), Value(2, 4096));
  SendGet({Key("far"), Key("here"), Key("gone")});
  EXPECT_TRUE(s_.pending);
  EXPECT_TRUE(Replies().empty());
  ASSERT_EQ(cluster_->fetches(), 1u);
  // Only what DRAM did not hold is asked of the cluster.
  EXPECT_EQ(cluster_->fetched_keys(0), (std::vector<KeyId>{Key("far"), Key("gone")}));
  EXPECT_TRUE(ops_->TakeReady().empty());

  cluster_->CompleteFetch();
  uint64_t wakes = 0;
  ASSERT_EQ(::read(wake_fd_, &wakes, sizeof(wakes)), static_cast<ssize_t>(sizeof(wakes)));
  EXPECT_GE(wakes, 1u);
  auto ready = ops_->TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].conn_id, s_.id);
  s_.pending = false;  // as the loop does before resuming
  ops_->Resume(s_, ready[0]);
  ExpectGetReply(OneReply(), {2, 1, -1});
  EXPECT_EQ(Metric("kvpool_ops_total", {{"op", "get"}}), 1);  // counted once, when answered
}

// An exists that stops at a miss opens a chain; a put starting at that
// miss is told to the placement, after the last hit. A put elsewhere is not.
TEST_F(LocalOpsTest, APutContinuingAnExistsChainIsNotedAfterItsLastHit) {
  Open(/*clustered=*/true);
  Hello();
  ASSERT_EQ(Put({Key("k0"), Key("k1")}, {1, 2}), (std::vector<int32_t>{0, 0}));
  cluster_->notes.clear();
  std::vector<uint8_t> body;
  std::vector<KeyId> chain = {Key("k0"), Key("k1"), Key("k2"), Key("k3")};
  protocol::EncodeKeys(chain, &body);
  Send(MessageType::kExists, body);
  auto replies = Replies();
  if (s_.pending) {  // asked the cluster about k2 and k3: answered at once
    auto ready = ops_->TakeReady();
    ASSERT_EQ(ready.size(), 1u);
    s_.pending = false;
    ops_->Resume(s_, ready[0]);
    replies = Replies();
  }
  ASSERT_EQ(replies.size(), 1u);
  protocol::ExistsReply ex;
  ASSERT_TRUE(protocol::DecodeExistsReply(replies[0].body, 4096, &ex).ok());
  EXPECT_EQ(ex.prefix_len, 2u);
  EXPECT_EQ(ex.hits, (std::vector<uint8_t>{1, 1, 0, 0}));

  EXPECT_EQ(Put({Key("k2"), Key("k3")}, {3, 4}), (std::vector<int32_t>{0, 0}));
  ASSERT_EQ(cluster_->notes.size(), 1u);
  ASSERT_TRUE(cluster_->notes[0].before.has_value());
  EXPECT_EQ(*cluster_->notes[0].before, Key("k1"));
  EXPECT_EQ(cluster_->notes[0].keys, (std::vector<KeyId>{Key("k2"), Key("k3")}));
  // The chain was used: another put is not noted.
  EXPECT_EQ(Put({Key("k4")}, {5}), (std::vector<int32_t>{0}));
  EXPECT_EQ(cluster_->notes.size(), 1u);
  // Each put that stored asks for one publish, when the loop says so.
  EXPECT_EQ(cluster_->publishes, 0);
  ops_->PublishStored();
  ops_->PublishStored();
  EXPECT_EQ(cluster_->publishes, 1);
}

// A large commit's copies run on the copy threads (a 1 MiB value split
// between both): the request parks, the loop is woken when the last copy is
// done, and Resume commits and answers; an unknown handle keeps its
// InvalidArgument. A small commit is copied and answered at once.
TEST_F(LocalOpsTest, ALargeCommitIsCopiedOffTheLoopAndASmallOneOnIt) {
  Open(/*clustered=*/false, /*staging_bytes=*/4 << 20);
  Hello();
  std::vector<KeyId> keys = {Key("big"), Key("mid"), Key("small")};
  std::vector<size_t> sizes = {1 << 20, 100000, 5000};
  auto handles = ReserveAndWrite(keys, sizes, {1, 2, 3});
  handles.push_back(999999);  // never reserved
  SendCommit(handles);
  EXPECT_TRUE(s_.pending);
  EXPECT_TRUE(Replies().empty());
  EXPECT_TRUE(s_.reservations.empty());  // moved into the parked commit
  auto ready = WaitReady();
  ASSERT_EQ(ready.size(), 1u);
  ops_->Resume(s_, ready[0]);
  EXPECT_FALSE(s_.pending);
  EXPECT_EQ(Statuses(OneReply()),
            (std::vector<int32_t>{0, 0, 0, static_cast<int32_t>(StatusCode::kInvalidArgument)}));
  for (size_t i = 0; i < keys.size(); ++i) {
    SendGet({keys[i]}, sizes[i]);
    ExpectGetReply(OneReply(), {static_cast<int>(i) + 1}, sizes[i]);
  }
  EXPECT_EQ(Metric("kvpool_ops_total", {{"op", "commit"}}), 1);

  // 2 x 4 KiB: under LocalOps::kInlineCopyBytes, answered at once.
  auto small = ReserveAndWrite({Key("s1"), Key("s2")}, {4096, 4096}, {7, 8});
  SendCommit(small);
  EXPECT_FALSE(s_.pending);
  EXPECT_EQ(Statuses(OneReply()), (std::vector<int32_t>{0, 0}));
  SendGet({Key("s1"), Key("s2")});
  ExpectGetReply(OneReply(), {7, 8});
  // The staging ranges were freed: the whole area can be reserved again.
  auto again = ReserveAndWrite({Key("a0"), Key("a1"), Key("a2"), Key("a3")},
                               {1 << 20, 1 << 20, 1 << 20, 1 << 20}, {9, 10, 11, 12});
  EXPECT_EQ(again.size(), 4u);
}

// The client leaves while its commit's copies run: they finish into slots
// and staging the parked commit still holds, and the request, found with
// no connection to answer, aborts its reservations. Nothing is stored.
TEST_F(LocalOpsTest, AClientLeavingMidCommitFreesNothingACopyStillUses) {
  Open(/*clustered=*/false, /*staging_bytes=*/4 << 20);
  Hello();
  // Hold the copy threads, so the commit is surely in flight when the
  // session goes.
  std::mutex gate;
  gate.lock();
  for (int i = 0; i < 2; ++i) copy_pool_.Submit([&] { std::lock_guard l(gate); });
  auto handles = ReserveAndWrite({Key("l1"), Key("l2")}, {1 << 20, 1 << 20}, {1, 2});
  SendCommit(handles);
  ASSERT_TRUE(s_.pending);
  ::munmap(staging_, staging_bytes_);
  staging_ = nullptr;
  s_ = LocalSession{};  // the connection closes: its staging area and session go
  gate.unlock();
  auto ready = WaitReady();
  ASSERT_EQ(ready.size(), 1u);
  ready.clear();  // the loop finds no connection and drops it
  EXPECT_FALSE(store_->Contains(Key("l1")));
  EXPECT_FALSE(store_->Contains(Key("l2")));
  // The aborted slots are free again: the whole store takes new values.
  Open(/*clustered=*/false, /*staging_bytes=*/4 << 20);
  Hello();
  auto h2 = ReserveAndWrite({Key("l1")}, {1 << 20}, {3});
  SendCommit(h2);
  auto r2 = WaitReady();
  ASSERT_EQ(r2.size(), 1u);
  ops_->Resume(s_, r2[0]);
  EXPECT_EQ(Statuses(OneReply()), (std::vector<int32_t>{0}));
  SendGet({Key("l1")}, 1 << 20);
  ExpectGetReply(OneReply(), {3}, 1 << 20);
}

}  // namespace
}  // namespace kvpool
