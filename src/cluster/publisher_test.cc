// Publisher on its own: node A publishes to itself (its directory) and to a
// home B that is a bare in-process transport, whose publish handler records
// each batch and takes it or refuses it as the test says. Retries run by a
// ManualClock.
#include "cluster/publisher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "membership/static_membership.h"
#include "testing/wait_for.h"
#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;
using testing::WaitFor;

class PublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Member> members = {{"a", "a:1", 0, 1.0}, {"b", "b:1", 0, 1.0}};
    auto membership = StaticMembership::Open({"a", 1, members}, &metrics_);
    ASSERT_TRUE(membership.ok());
    cluster_ = Cluster::Assemble("a", net_.AddNode("a:1"), std::move(membership).value());
    b_ = net_.AddNode("b:1");
    b_->RegisterHandler(kPeerPublish, [this](transport::Incoming in, transport::Responder r) {
      PublishBatch batch;
      Status s = DecodePublish(in.payload, &batch);
      {
        std::lock_guard lock(mu_);
        batches_.push_back(batch);
      }
      r.Respond(refuse_.load() ? Unavailable("b refuses") : s, {});
    });
    directory_ = std::make_unique<Directory>(DirectoryOptions{}, &metrics_);
  }
  void TearDown() override {
    publisher_.reset();
    pool_.Stop();
  }

  Publisher& Make(const PublisherOptions& o) {
    publisher_ = std::make_unique<Publisher>(o, cluster_.get(), directory_.get(), &pool_, &metrics_,
                                             &clock_);
    return *publisher_;
  }
  // n keys whose home is node `id`, from Key(first) on.
  std::vector<KeyId> HomedOn(const std::string& id, size_t n, uint64_t first = 0) {
    std::vector<KeyId> keys;
    auto map = cluster_->shard_map();
    for (uint64_t i = first; keys.size() < n; ++i) {
      KeyId k = MakeKeyId("pub", std::to_string(i));
      if (map->HomeOf(k)->node_id == id) keys.push_back(k);
    }
    return keys;
  }
  std::vector<PublishBatch> Batches() {
    std::lock_guard lock(mu_);
    return batches_;
  }
  double Value(const std::string& name) { return metrics_.ValueOf(name); }
  double Sent() { return Value("kvpool_publish_items_total"); }
  double Dropped() { return Value("kvpool_publish_dropped_total"); }
  double Errors() { return metrics_.ValueOf("kvpool_peer_errors_total", {{"op", "publish"}}); }

  MetricsRegistry metrics_;
  ManualClock clock_;
  transport::InProcessNetwork net_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<transport::Transport> b_;
  std::unique_ptr<Directory> directory_;
  ThreadPool pool_{1, "test-publish"};
  std::unique_ptr<Publisher> publisher_;
  std::atomic<bool> refuse_{false};
  std::mutex mu_;
  std::vector<PublishBatch> batches_;  // protected by mu_
};

TEST_F(PublisherTest, AFlushAppliesItsOwnKeysHereAndSendsOneBatchPerHome) {
  Publisher& p = Make({});
  auto mine = HomedOn("a", 5), theirs = HomedOn("b", 7);
  for (const KeyId& k : mine) p.Add(k, 100);
  for (const KeyId& k : theirs) p.Add(k, 200);
  p.Remove(theirs[0]);
  EXPECT_EQ(p.queued(), 13u);
  EXPECT_EQ(directory_->entries(), 0u);  // nothing before the flush
  p.Flush();
  EXPECT_EQ(p.queued(), 0u);
  EXPECT_EQ(directory_->entries(), 5u);  // applied synchronously
  ASSERT_TRUE(WaitFor([&] { return Sent() == 13; }));
  auto batches = Batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].node_id, "a");
  EXPECT_EQ(batches[0].incarnation, 1u);
  ASSERT_EQ(batches[0].items.size(), 8u);  // queue order
  for (size_t i = 0; i < theirs.size(); ++i) {
    EXPECT_EQ(batches[0].items[i].key, theirs[i]);
    EXPECT_EQ(batches[0].items[i].op, PublishOp::kAdd);
    EXPECT_EQ(batches[0].items[i].size, 200u);
  }
  EXPECT_EQ(batches[0].items[7].key, theirs[0]);
  EXPECT_EQ(batches[0].items[7].op, PublishOp::kRemove);
  EXPECT_EQ(Dropped(), 0);
  EXPECT_EQ(metrics_.ValueOf("kvpool_publish_queued_total", {{"op", "add"}}), 12);
  EXPECT_EQ(metrics_.ValueOf("kvpool_publish_queued_total", {{"op", "remove"}}), 1);
}

TEST_F(PublisherTest, ABatchAHomeRefusesIsSentAgainAfterTheDelayThenDropped) {
  PublisherOptions o;
  o.max_retries = 2;
  o.retry_delay = milliseconds(200);
  Publisher& p = Make(o);
  refuse_ = true;
  auto theirs = HomedOn("b", 4);
  for (const KeyId& k : theirs) p.Add(k, 1);
  p.Flush();
  ASSERT_TRUE(WaitFor([&] { return p.retrying() == 4; }));
  EXPECT_EQ(Errors(), 1);
  // Not due yet: a flush sends nothing.
  clock_.Advance(milliseconds(199));
  p.Flush();
  EXPECT_EQ(Batches().size(), 1u);
  // Due: the same items again, counted as retried; twice (max_retries).
  for (int attempt = 1; attempt <= 2; ++attempt) {
    clock_.Advance(milliseconds(1 + (attempt > 1 ? 199 : 0)));
    p.Flush();  // takes the due items (their failure may queue them again at once)
    EXPECT_EQ(Value("kvpool_publish_retried_total"), 4.0 * attempt);
    ASSERT_TRUE(WaitFor([&] { return Errors() == 1 + attempt; })) << attempt;
    auto batches = Batches();
    ASSERT_EQ(batches.size(), 1u + attempt);
    ASSERT_EQ(batches.back().items.size(), theirs.size());
    for (size_t i = 0; i < theirs.size(); ++i) EXPECT_EQ(batches.back().items[i].key, theirs[i]);
    if (attempt < 2) {
      ASSERT_TRUE(WaitFor([&] { return p.retrying() == 4; }));
    }
  }
  // Out of retries: dropped and counted, never sent again.
  ASSERT_TRUE(WaitFor([&] { return Dropped() == 4; }));
  EXPECT_EQ(p.retrying(), 0u);
  clock_.Advance(milliseconds(1000));
  p.Flush();
  EXPECT_EQ(Batches().size(), 3u);
  EXPECT_EQ(Sent(), 0);
}

TEST_F(PublisherTest, ARetryGoesToTheHomeThatTakesItOnceItDoes) {
  PublisherOptions o;
  o.retry_delay = milliseconds(50);
  Publisher& p = Make(o);
  refuse_ = true;
  auto theirs = HomedOn("b", 3);
  for (const KeyId& k : theirs) p.Add(k, 1);
  p.Flush();
  ASSERT_TRUE(WaitFor([&] { return p.retrying() == 3; }));
  refuse_ = false;
  clock_.Advance(milliseconds(50));
  p.Flush();
  ASSERT_TRUE(WaitFor([&] { return Sent() == 3; }));
  EXPECT_EQ(Batches().size(), 2u);
  EXPECT_EQ(Dropped(), 0);
}

TEST_F(PublisherTest, ItemsBeyondTheQueueBoundAreDroppedAndCounted) {
  PublisherOptions o;
  o.max_queue = 4;
  Publisher& p = Make(o);
  for (const KeyId& k : HomedOn("a", 6)) p.Add(k, 1);
  EXPECT_EQ(p.queued(), 4u);
  EXPECT_EQ(Dropped(), 2);
  p.Flush();
  EXPECT_EQ(directory_->entries(), 4u);
}

TEST_F(PublisherTest, AFullBatchIsFlushedWithoutWaitingForTheTick) {
  PublisherOptions o;
  o.max_batch = 8;
  Publisher& p = Make(o);
  for (const KeyId& k : HomedOn("a", 8)) p.Add(k, 1);
  // The eighth item scheduled a flush on the executor.
  ASSERT_TRUE(WaitFor([&] { return directory_->entries() == 8; }));
  EXPECT_EQ(p.queued(), 0u);
}

TEST_F(PublisherTest, WaitBelowWakesOnAFlushAndOtherwiseTimesOut) {
  Publisher& p = Make({});
  for (const KeyId& k : HomedOn("a", 3)) p.Add(k, 1);
  EXPECT_FALSE(p.WaitBelow(1, milliseconds(10)));  // nobody flushes
  EXPECT_TRUE(p.WaitBelow(4, milliseconds(0)));    // 3 < 4 already
  std::atomic<bool> woke{false};
  std::thread waiter([&] { woke = p.WaitBelow(1, milliseconds(10000)); });
  p.Flush();
  waiter.join();
  EXPECT_TRUE(woke.load());
}

}  // namespace
}  // namespace kvpool::cluster
