// RouteFetcher on its own: node A's fetcher over the in-process transport,
// and peers B and C that are bare transports whose lookup and fetch
// handlers answer from tables the test fills (D is a member with no node
// behind its address: calls to it fail Unavailable). Cool-downs and the
// lookup cache run by a ManualClock.
#include "peer/route_fetch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "cluster/cluster.h"
#include "common/clock.h"
#include "membership/static_membership.h"
#include "peer/peer_messages_format.h"
#include "testing/wait_for.h"
#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;
using testing::WaitFor;

// A peer that holds values and, as a home, answers lookups from a table.
struct Peer {
  std::unique_ptr<transport::Transport> transport;
  std::mutex mu;
  std::map<KeyId, std::vector<uint8_t>> values;  // protected by mu
  std::map<KeyId, LookupResult> listed;          // protected by mu
  std::atomic<int> fetches{0}, lookups{0};

  void Serve() {
    transport->RegisterHandler(kPeerFetch, [this](transport::Incoming in, transport::Responder r) {
      ++fetches;
      KeyId key;
      uint64_t max_size = 0;
      Status s = DecodeFetch(in.request, &key, &max_size);
      if (!s.ok()) return r.Respond(s);
      std::shared_ptr<std::vector<uint8_t>> value;
      {
        std::lock_guard lock(mu);
        auto it = values.find(key);
        if (it == values.end()) return r.Respond(NotFound("not held"));
        value = std::make_shared<std::vector<uint8_t>>(it->second);
      }
      if (value->size() > max_size) return r.Respond(ResourceExhausted("too large"));
      transport::ServerReply reply;
      EncodeFetchReply(value->size(), &reply.header);
      reply.payload = *value;
      reply.release = [value] {};
      r.Respond(std::move(reply));
    });
    transport->RegisterHandler(kPeerLookup, [this](transport::Incoming in, transport::Responder r) {
      ++lookups;
      std::vector<KeyId> keys;
      Status s = DecodeLookup(in.payload, &keys);
      if (!s.ok()) return r.Respond(s);
      std::vector<LookupResult> results(keys.size());
      {
        std::lock_guard lock(mu);
        for (size_t i = 0; i < keys.size(); ++i) {
          auto it = listed.find(keys[i]);
          if (it != listed.end()) results[i] = it->second;
        }
      }
      auto body = std::make_shared<std::vector<uint8_t>>();
      EncodeLookupReply(results, body.get());
      transport::ServerReply reply;
      reply.payload = *body;
      reply.release = [body] {};
      r.Respond(std::move(reply));
    });
  }
};

std::vector<uint8_t> Bytes(int seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return v;
}

class RouteFetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Member> members;
    for (const char* id : {"a", "b", "c", "d"})
      members.push_back({id, std::string(id) + ":1", 0, 1.0});
    auto membership = StaticMembership::Open({"a", 1, members}, &metrics_);
    ASSERT_TRUE(membership.ok());
    cluster_ = Cluster::Assemble("a", net_.AddNode("a:1"), std::move(membership).value());
    for (Peer* p : {&b_, &c_}) {
      p->transport = net_.AddNode(p == &b_ ? "b:1" : "c:1");
      p->Serve();
    }
    RouteFetcherOptions o;
    o.cooldown = milliseconds(2000);
    o.lookup_cache_ttl = milliseconds(1000);
    fetcher_ = std::make_unique<RouteFetcher>(o, cluster_->transport(), &metrics_, &clock_);
  }
  void TearDown() override {
    fetcher_.reset();
    cluster_.reset();  // fails what is still in flight
  }

  Routes CurrentRoutes() { return Routes{cluster_->view(), cluster_->shard_map(), "a"}; }
  KeyId HomedOn(const std::string& id, int from = 0) {
    auto map = cluster_->shard_map();
    for (int i = from;; ++i) {
      KeyId k = MakeKeyId("rf", std::to_string(i));
      if (map->HomeOf(k)->node_id == id) return k;
    }
  }
  // Fetches key from peers in order into a sink of sink_size bytes.
  std::pair<Status, std::vector<uint8_t>> Fetch(const KeyId& key, std::vector<std::string> peers,
                                                uint64_t expected_size, size_t sink_size) {
    auto sink = std::make_shared<std::vector<uint8_t>>(sink_size);
    std::mutex mu;
    bool done = false;
    Status status;
    uint64_t size = 0;
    FetchRequest req;
    req.key = key;
    req.peers = std::move(peers);
    req.sink = *sink;
    req.expected_size = expected_size;
    req.deadline = transport::SteadyClock::now() + milliseconds(5000);
    fetcher_->Fetch(req, nullptr, [&](const Status& s, uint64_t n) {
      std::lock_guard lock(mu);
      status = s;
      size = n;
      done = true;
    });
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard lock(mu);
      return done;
    }));
    std::lock_guard lock(mu);
    sink->resize(status.ok() ? size : 0);
    return {status, *sink};
  }
  // Looks key up; its one result, or the status of a failed lookup.
  std::pair<Status, LookupResult> Lookup(const KeyId& key) {
    auto batch = std::make_shared<LookupBatch>(std::vector<KeyId>{key});
    std::mutex mu;
    bool done = false;
    Status status;
    fetcher_->Lookup(
        CurrentRoutes(), batch, {0}, transport::SteadyClock::now() + milliseconds(5000),
        [](std::span<const KeyId> keys) { return std::vector<LookupResult>(keys.size()); },
        [&](std::vector<size_t> idx, const Status& s, RouteFetcher::ResolvedOn) {
          std::lock_guard lock(mu);
          EXPECT_EQ(idx, std::vector<size_t>{0});
          status = s;
          done = true;
        });
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard lock(mu);
      return done;
    }));
    std::lock_guard lock(mu);
    return {status, batch->results[0]};
  }

  MetricsRegistry metrics_;
  ManualClock clock_;
  transport::InProcessNetwork net_;
  std::unique_ptr<Cluster> cluster_;
  Peer b_, c_;
  std::unique_ptr<RouteFetcher> fetcher_;
};

TEST_F(RouteFetcherTest, AFetchTriesTheHoldersInTurnUntilOneServes) {
  const KeyId key = MakeKeyId("rf", "walk");
  const auto value = Bytes(1, 3000);
  c_.values[key] = value;  // b has dropped it
  auto [status, got] = Fetch(key, {"b:1", "c:1"}, 0, 4096);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(got, value);
  EXPECT_EQ(b_.fetches.load(), 1);
  EXPECT_EQ(c_.fetches.load(), 1);
  EXPECT_FALSE(fetcher_->Cooling("b:1"));  // a miss is not a failed peer
  // Held nowhere: NotFound after both.
  auto [missing, none] = Fetch(MakeKeyId("rf", "gone"), {"b:1", "c:1"}, 0, 4096);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_TRUE(none.empty());
}

TEST_F(RouteFetcherTest, AValueOfAnotherSizeThanTheDirectorySaysIsNotTaken) {
  const KeyId key = MakeKeyId("rf", "sized");
  b_.values[key] = Bytes(2, 900);  // stale: another size
  c_.values[key] = Bytes(3, 1000);
  auto [status, got] = Fetch(key, {"b:1", "c:1"}, 1000, 4096);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(got, Bytes(3, 1000));
  EXPECT_EQ(b_.fetches.load(), 1);
}

TEST_F(RouteFetcherTest, AHolderThatIsDownIsAvoidedForTheCooldown) {
  const KeyId key = MakeKeyId("rf", "down");
  c_.values[key] = Bytes(4, 512);
  auto [status, got] = Fetch(key, {"d:1", "c:1"}, 0, 4096);  // nothing listens at d:1
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(got, Bytes(4, 512));
  EXPECT_TRUE(fetcher_->Cooling("d:1"));
  // A lookup answer naming d and c: only c is a candidate while d cools.
  LookupResult r;
  r.size = 512;
  r.holders = {{"d", 0}, {"c", 0}, {"a", 0}};  // a: the asker itself, never a candidate
  EXPECT_EQ(fetcher_->Candidates(CurrentRoutes(), r), std::vector<std::string>{"c:1"});
  clock_.Advance(milliseconds(1999));
  EXPECT_TRUE(fetcher_->Cooling("d:1"));
  clock_.Advance(milliseconds(1));
  EXPECT_FALSE(fetcher_->Cooling("d:1"));
  EXPECT_EQ(fetcher_->Candidates(CurrentRoutes(), r), (std::vector<std::string>{"d:1", "c:1"}));
}

TEST_F(RouteFetcherTest, ALookupAnswerIsReusedForItsTtlThenAskedAgain) {
  const KeyId key = HomedOn("b");
  LookupResult listed;
  listed.size = 777;
  listed.holders = {{"c", 0}};
  b_.listed[key] = listed;
  auto [s1, r1] = Lookup(key);
  ASSERT_TRUE(s1.ok()) << s1.ToString();
  EXPECT_EQ(r1.size, 777u);
  EXPECT_EQ(r1.holders, listed.holders);
  EXPECT_EQ(b_.lookups.load(), 1);
  EXPECT_EQ(fetcher_->CachedCandidates(CurrentRoutes(), key), std::vector<std::string>{"c:1"});
  // Within the TTL: from the cache, B not asked.
  clock_.Advance(milliseconds(999));
  auto [s2, r2] = Lookup(key);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(r2.holders, listed.holders);
  EXPECT_EQ(b_.lookups.load(), 1);
  // Past it: asked again.
  clock_.Advance(milliseconds(1));
  EXPECT_TRUE(fetcher_->CachedCandidates(CurrentRoutes(), key).empty());
  auto [s3, r3] = Lookup(key);
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ(b_.lookups.load(), 2);
}

TEST_F(RouteFetcherTest, AKeyWhoseHomeIsDownResolvesAsAFailedLookup) {
  const KeyId key = HomedOn("d");
  auto [status, result] = Lookup(key);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(result.size, 0u);
  EXPECT_TRUE(result.holders.empty());
  EXPECT_TRUE(fetcher_->Cooling("d:1"));
}

}  // namespace
}  // namespace kvpool::cluster
