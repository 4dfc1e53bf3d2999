// Directory, publishing and remote reads of three nodes in one process,
// over the in-process transport with a static membership: byte-exact
// fetches into local DRAM slots, exists, replicas published, a dead holder
// skipped for a live one, a dead home a miss.
#include "cluster/remote_reader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cluster/anti_entropy.h"
#include "cluster/cluster_placement.h"
#include "cluster/holdings_announcer.h"
#include "cluster/peer_server.h"
#include "common/clock.h"
#include "membership/static_membership.h"
#include "testing/manual_scheduler.h"
#include "testing/wait_for.h"
#include "transport/fault_transport.h"
#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;
using testing::WaitFor;

std::vector<uint8_t> Bytes(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

KeyId Key(uint64_t i) { return MakeKeyId("rr", std::to_string(i)); }

// Holds the lookups sent to one address until Open(): a home that is slow
// to answer, under the test's control.
class GatedTransport final : public transport::Transport {
 public:
  GatedTransport(std::unique_ptr<transport::Transport> inner, std::string gated_peer)
      : inner_(std::move(inner)), gated_peer_(std::move(gated_peer)) {}
  std::string address() const override { return inner_->address(); }
  void RegisterHandler(transport::MessageType type, transport::Handler h) override {
    inner_->RegisterHandler(type, std::move(h));
  }
  void Call(const transport::CallArgs& args, transport::ReplyCallback done) override {
    {
      std::lock_guard lock(mu_);
      KeyId key;
      uint64_t max_size = 0;
      if (args.type == kPeerFetch && DecodeFetch(args.request, &key, &max_size).ok()) {
        fetched_.push_back(key);
      }
      if (closed_ && args.type == kPeerLookup && args.peer == gated_peer_) {
        held_.push_back({args, std::move(done)});
        return;
      }
    }
    inner_->Call(args, std::move(done));
  }
  size_t held() {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  // The keys of the fetches sent, in the order they were sent.
  std::vector<KeyId> fetched() {
    std::lock_guard lock(mu_);
    return fetched_;
  }
  void Open() {
    std::vector<std::pair<transport::CallArgs, transport::ReplyCallback>> held;
    {
      std::lock_guard lock(mu_);
      closed_ = false;
      held.swap(held_);
    }
    for (auto& [args, done] : held) inner_->Call(args, std::move(done));
  }

 private:
  std::unique_ptr<transport::Transport> inner_;
  const std::string gated_peer_;
  std::mutex mu_;
  bool closed_ = true;  // protected by mu_
  std::vector<std::pair<transport::CallArgs, transport::ReplyCallback>> held_;  // protected by mu_
  std::vector<KeyId> fetched_;                                                 // protected by mu_
};

// Owns the node's transport and a FaultTransport over it (the node's own
// calls get the faults; its handlers pass through).
class FaultyTransport final : public transport::Transport {
 public:
  explicit FaultyTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)), fault_(inner_.get(), /*seed=*/7) {}
  transport::FaultTransport& fault() { return fault_; }
  std::string address() const override { return fault_.address(); }
  void RegisterHandler(transport::MessageType type, transport::Handler h) override {
    fault_.RegisterHandler(type, std::move(h));
  }
  void Call(const transport::CallArgs& args, transport::ReplyCallback done) override {
    fault_.Call(args, std::move(done));
  }

 private:
  std::unique_ptr<transport::Transport> inner_;
  transport::FaultTransport fault_;  // destroyed before inner_
};

// Counts a store's holdings events by (why, origin) and passes them on to
// the node's announcer.
class Tee final : public HoldingsObserver {
 public:
  explicit Tee(HoldingsObserver* next) : next_(next) {}
  void OnHoldings(const HoldingsEvent& e) override {
    {
      std::lock_guard lock(mu_);
      ++counts_[{e.why, e.origin}];
    }
    next_->OnHoldings(e);
  }
  uint64_t Count(HoldingsEvent::Why why, WriteOrigin origin = WriteOrigin::kPut) {
    std::lock_guard lock(mu_);
    return counts_[{why, origin}];
  }

 private:
  HoldingsObserver* const next_;
  std::mutex mu_;
  std::map<std::pair<HoldingsEvent::Why, WriteOrigin>, uint64_t> counts_;
};

struct TestNode {
  MetricsRegistry metrics;  // outlives everything below
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<TieredStore> tiered;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<Directory> directory;
  std::unique_ptr<HoldingsAnnouncer> announcer;
  std::unique_ptr<PeerServer> server;
  std::unique_ptr<RemoteReader> reader;
  std::unique_ptr<ClusterPlacement> placement;  // over reader and announcer, as the node's
  std::unique_ptr<AntiEntropy> anti_entropy;    // StartAntiEntropy
  RemoteReaderOptions reader_options;
  const Clock* reader_clock = nullptr;
  Placement placement_kind = Placement::kLocal;
  GatedTransport* gate = nullptr;     // owned by cluster; null unless gated
  FaultyTransport* faulty = nullptr;  // owned by cluster; null unless asked for

  // gate_lookups_to: an address whose lookups from this node are held
  // (see GatedTransport; reachable through `gate`).
  // faults: the node's calls go through a FaultTransport (`faulty`).
  // eviction: the DRAM policy (the fetch order follows it).
  // clock: the reader's (cool-downs, lookup cache TTL).
  TestNode(transport::InProcessNetwork* net, const std::string& id,
           const std::vector<Member>& members, const Clock* clock,
           const std::string& gate_lookups_to = "", bool faults = false,
           bool placement_home = false, const std::string& eviction = "prefix") {
    DramOptions d;
    d.capacity_bytes = 64u << 20;  // room for every size class the test uses
    d.slab_bytes = 1u << 20;
    d.max_value_bytes = 1u << 20;
    d.huge_pages = false;
    d.prefault = false;
    d.eviction = eviction;
    pool = std::make_unique<ThreadPool>(2, "test-peer");
    tiered = TieredStore::Open(d, nullptr, pool.get(), pool.get(), TieringOptions{}, &metrics)
                 .value();
    StaticMembershipOptions so{id, 1, members};
    auto membership = StaticMembership::Open(so, &metrics);
    EXPECT_TRUE(membership.ok());
    std::unique_ptr<transport::Transport> t = net->AddNode(id + ":1");
    if (faults) {
      auto f = std::make_unique<FaultyTransport>(std::move(t));
      faulty = f.get();
      t = std::move(f);
    }
    if (!gate_lookups_to.empty()) {
      auto gated = std::make_unique<GatedTransport>(std::move(t), gate_lookups_to);
      gate = gated.get();
      t = std::move(gated);
    }
    cluster = Cluster::Assemble(id, std::move(t), std::move(membership).value());
    directory = std::make_unique<Directory>(DirectoryOptions{}, &metrics);
    HoldingsAnnouncerOptions ao;
    ao.publish_interval = milliseconds(0);  // the tests flush
    if (placement_home) {
      HomePlacerOptions po;
      po.timeout = milliseconds(300);
      ao.placement = po;
    }
    announcer = std::make_unique<HoldingsAnnouncer>(ao, cluster.get(), directory.get(),
                                                    tiered.get(), pool.get(), &metrics, clock);
    server = std::make_unique<PeerServer>(cluster.get(), directory.get(), announcer.get(),
                                          tiered.get(), pool.get());
    reader_options.lookup_timeout = milliseconds(300);
    reader_options.fetch_timeout = milliseconds(300);
    if (gate != nullptr) reader_options.lookup_timeout = milliseconds(10000);  // held, not lost
    reader_clock = clock;
    reader = std::make_unique<RemoteReader>(reader_options, cluster.get(), directory.get(),
                                            tiered.get(), pool.get(), &metrics, clock);
    placement_kind = placement_home ? Placement::kHome : Placement::kLocal;
    placement = std::make_unique<ClusterPlacement>(placement_kind, announcer.get(), reader.get());
    announcer->Start();
  }

  // Replaces the reader by one that keeps replicas as `replicas` says.
  void SetReplicas(RemoteReaderOptions::Replicas replicas, size_t window = 256) {
    reader->Stop();
    reader.reset();
    reader_options.replicas = replicas;
    reader_options.replica_window = window;
    reader = std::make_unique<RemoteReader>(reader_options, cluster.get(), directory.get(),
                                            tiered.get(), pool.get(), &metrics, reader_clock);
    placement = std::make_unique<ClusterPlacement>(placement_kind, announcer.get(), reader.get());
  }

  // Anti-entropy with rounds on `scheduler` (its handlers serve the others'
  // rounds from now on).
  void StartAntiEntropy(Scheduler* scheduler) {
    AntiEntropyOptions o;
    o.interval = milliseconds(5000);
    o.scheduler = scheduler;
    anti_entropy = std::make_unique<AntiEntropy>(o, cluster.get(), directory.get(), announcer.get(),
                                                 tiered.get(), &metrics);
    anti_entropy->Start();
  }

  // The node's shutdown order (cluster_services.cc).
  ~TestNode() {
    announcer->Stop();
    reader->Stop();
    if (anti_entropy) anti_entropy->Stop();
    pool->Stop();
    cluster.reset();
    anti_entropy.reset();
    server.reset();
    placement.reset();
    reader.reset();
    announcer.reset();
    directory.reset();
  }

  void Put(const KeyId& key, const std::vector<uint8_t>& v) {
    auto r = tiered->Reserve(key, v.size());
    ASSERT_TRUE(r.ok());
    std::memcpy(r->data(), v.data(), v.size());
    ASSERT_TRUE(tiered->Commit(std::move(r).value()).ok());  // published by the announcer
  }

  std::vector<TieredStore::Pin> Fetch(std::vector<KeyId> keys) {
    std::promise<std::vector<TieredStore::Pin>> done;
    auto f = done.get_future();
    reader->Fetch(std::move(keys), [&](std::vector<TieredStore::Pin> pins) {
      done.set_value(std::move(pins));
    });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    return f.get();
  }

  size_t ExistsCount(std::vector<KeyId> keys) {
    std::promise<size_t> done;
    auto f = done.get_future();
    reader->Exists(std::move(keys), [&](std::vector<KeyId> hits) { done.set_value(hits.size()); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    return f.get();
  }

  std::vector<uint8_t> Read(const TieredStore::Pin& p) const {
    return {p.data(), p.data() + p.size()};
  }
};

class RemoteReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Member> members;
    for (const char* id : {"a", "b", "c"}) members.push_back({id, std::string(id) + ":1", 0, 1.0});
    for (const char* id : {"a", "b", "c"}) {
      // B's lookups at C are held until the test opens the gate; C's calls
      // go through a FaultTransport (no faults unless a test sets them).
      nodes_.push_back(std::make_unique<TestNode>(&net_, id, members, &clock_,
                                                  std::string(id) == "b" ? "c:1" : "",
                                                  /*faults=*/std::string(id) == "c"));
    }
  }
  void FlushAll() {
    for (auto& n : nodes_) {
      if (n) n->announcer->Flush();
    }
  }
  // Puts on A the first n keys from Key(first) whose home (a node id)
  // `take` accepts, each Bytes(i, 4096), and returns them in order.
  std::vector<KeyId> PutOnA(uint64_t first, size_t n,
                            const std::function<bool(const std::string& home)>& take) {
    std::vector<KeyId> keys;
    auto map = nodes_[1]->cluster->shard_map();
    for (uint64_t i = first; keys.size() < n && i < first + 1000; ++i) {
      if (!take(map->HomeOf(Key(i))->node_id)) continue;
      keys.push_back(Key(i));
      nodes_[0]->Put(keys.back(), Bytes(i, 4096));
    }
    return keys;
  }
  // Publishing crosses the network thread: wait (bounded) for the homes.
  bool WaitDirectoryEntries(uint64_t n) {
    return WaitFor(
        [&] {
          uint64_t total = 0;
          for (auto& node : nodes_) total += node ? node->directory->entries() : 0;
          return total == n;
        },
        milliseconds(2000));
  }

  // The readers' clock: cool-downs and cached lookups end only when a test
  // advances it.
  ManualClock clock_;
  transport::InProcessNetwork net_;  // outlives the nodes
  std::vector<std::unique_ptr<TestNode>> nodes_;
};

// Under the default (Replicas::kRepeat) a value fetched once is served to
// its read and dropped; fetched again within the window it is kept.
TEST_F(RemoteReaderTest, FetchesByteExactAndKeepsReplicasOfValuesFetchedAgain) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  TestNode& b = *nodes_[1];
  TestNode& c = *nodes_[2];
  const int kN = 40;
  std::vector<KeyId> keys;
  std::vector<std::vector<uint8_t>> vals;
  std::map<KeyId, int> index;
  for (int i = 0; i < kN; ++i) {
    keys.push_back(Key(i));
    vals.push_back(Bytes(i, 1 + i * 997));
    index[keys.back()] = i;
    a.Put(keys.back(), vals.back());
  }
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(kN));
  EXPECT_EQ(b.ExistsCount(keys), static_cast<size_t>(kN));
  Counter* hits = b.metrics.GetCounter("kvpool_remote_hits_total", "");
  Counter* kept = b.metrics.GetCounter("kvpool_remote_replicas_kept_total", "");

  auto pins = b.Fetch(keys);
  ASSERT_EQ(pins.size(), static_cast<size_t>(kN)) << b.metrics.RenderPrometheus();
  EXPECT_EQ(hits->Value(), static_cast<uint64_t>(kN));
  EXPECT_EQ(kept->Value(), 0u);
  for (const auto& p : pins) EXPECT_EQ(b.Read(p), vals[index.at(p.key())]);
  pins.clear();
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(b.tiered->Acquire(keys[i]).status().code(), StatusCode::kNotFound) << i;
  }
  EXPECT_EQ(b.tiered->GetDramStats().pinned, 0u);

  pins = b.Fetch(keys);  // again: kept this time
  ASSERT_EQ(pins.size(), static_cast<size_t>(kN));
  EXPECT_EQ(hits->Value(), static_cast<uint64_t>(2 * kN));
  EXPECT_EQ(kept->Value(), static_cast<uint64_t>(kN));
  pins.clear();
  for (int i = 0; i < kN; ++i) {
    auto p = b.tiered->Acquire(keys[i]);  // a local replica now
    ASSERT_TRUE(p.ok()) << i;
    EXPECT_EQ(b.Read(*p), vals[i]) << i;
  }
  // Keys held nowhere miss; they are not in the result.
  EXPECT_TRUE(c.Fetch({Key(1000), Key(1001)}).empty());
  EXPECT_EQ(c.ExistsCount({Key(1000)}), 0u);

  // B's replicas are published: with A gone, C still finds every key whose
  // home is alive, from B (A, if tried first, fails and is skipped).
  FlushAll();
  // B's publishes cross the network: wait (bounded) until all were answered.
  Counter* published = b.metrics.GetCounter("kvpool_publish_items_total", "");
  WaitFor([&] { return published->Value() >= static_cast<uint64_t>(kN); }, milliseconds(2000));
  ASSERT_EQ(published->Value(), static_cast<uint64_t>(kN));
  std::vector<KeyId> homed_alive;
  auto map = c.cluster->shard_map();
  for (const auto& k : keys) {
    if (map->HomeOf(k)->node_id != "a") homed_alive.push_back(k);
  }
  ASSERT_FALSE(homed_alive.empty());
  nodes_[0].reset();  // A dies (its address now answers Unavailable)
  auto got = c.Fetch(homed_alive);
  EXPECT_EQ(got.size(), homed_alive.size());
  for (const auto& p : got) {
    bool matched = false;
    for (int i = 0; i < kN; ++i) matched |= c.Read(p) == vals[i];
    EXPECT_TRUE(matched);
  }
  // Keys whose home was A: the lookup fails, a miss (A is cooling down).
  std::vector<KeyId> homed_a;
  for (const auto& k : keys) {
    if (map->HomeOf(k)->node_id == "a") homed_a.push_back(k);
  }
  if (!homed_a.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(c.Fetch(homed_a).empty());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
  }
}

// Which fetched values stay as replicas: all of them (kAll), none even when
// fetched again (kNone), and under kRepeat those fetched within the last
// `window` fetched values, counted exactly.
TEST_F(RemoteReaderTest, ReplicasAreKeptAsTheSettingSays) {
  nodes_[1]->gate->Open();
  TestNode& b = *nodes_[1];
  std::vector<KeyId> keys = PutOnA(7000, 8, [](const std::string&) { return true; });
  ASSERT_EQ(keys.size(), 8u);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  Counter* kept = b.metrics.GetCounter("kvpool_remote_replicas_kept_total", "");
  // Fetches key k alone; whether B holds it after the read.
  auto fetch_one = [&](const KeyId& k) {
    EXPECT_EQ(b.Fetch({k}).size(), 1u);
    bool is_held = b.tiered->Acquire(k).ok();  // the pin is released at once
    if (is_held) {
      EXPECT_TRUE(b.tiered->Remove(k).ok());  // the next read fetches again
    }
    return is_held;
  };

  b.SetReplicas(RemoteReaderOptions::Replicas::kNone);
  EXPECT_FALSE(fetch_one(keys[0]));
  EXPECT_FALSE(fetch_one(keys[0]));
  EXPECT_EQ(kept->Value(), 0u);

  b.SetReplicas(RemoteReaderOptions::Replicas::kAll);
  EXPECT_TRUE(fetch_one(keys[1]));
  EXPECT_EQ(kept->Value(), 1u);

  // Window of 4: after keys 2..7 it remembers 4, 5, 6, 7.
  b.SetReplicas(RemoteReaderOptions::Replicas::kRepeat, 4);
  for (size_t i = 2; i < 8; ++i) EXPECT_FALSE(fetch_one(keys[i])) << i;
  EXPECT_TRUE(fetch_one(keys[4]));   // 4 remembered; now 5, 6, 7, 4
  EXPECT_FALSE(fetch_one(keys[3]));  // 3 forgotten; now 6, 7, 4, 3
  EXPECT_TRUE(fetch_one(keys[3]));   // 3 remembered; now 7, 4, 3, 3
  EXPECT_FALSE(fetch_one(keys[6]));  // 6 forgotten; now 4, 3, 3, 6
  EXPECT_TRUE(fetch_one(keys[4]));   // 4 still there (its older copy left)
  EXPECT_EQ(kept->Value(), 4u);
  EXPECT_EQ(b.metrics.GetCounter("kvpool_remote_hits_total", "")->Value(), 14u);
  EXPECT_EQ(b.tiered->GetDramStats().pinned, 0u);
}

// PublishNow (a put that stored values calls it before its answer) sends
// what the node queued for the homes at once: puts, and drops as well.
TEST_F(RemoteReaderTest, PublishNowSendsWhatIsQueued) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  std::vector<KeyId> keys;
  for (int i = 0; i < 24; ++i) {
    keys.push_back(Key(3000 + i));
    a.Put(keys.back(), Bytes(3000 + i, 4096));
  }
  auto listed = [&] {
    uint64_t n = 0;
    for (auto& node : nodes_) n += node->directory->entries();
    return n;
  };
  // Queued only: the tests' announcers have no schedule.
  EXPECT_EQ(a.announcer->queued(), keys.size());
  EXPECT_EQ(listed(), 0u);
  // Under placement home it leaves them to the schedule (values put there
  // are published by their homes).
  ClusterPlacement home(Placement::kHome, a.announcer.get(), a.reader.get());
  home.PublishNow();
  EXPECT_EQ(a.announcer->queued(), keys.size());
  a.placement->PublishNow();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  EXPECT_EQ(nodes_[2]->ExistsCount(keys), keys.size());
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(a.tiered->Remove(keys[i]).ok());
  a.placement->PublishNow();
  ASSERT_TRUE(WaitDirectoryEntries(12));
  // B asks (C would reuse its cached answers: --peer-lookup-cache-ttl).
  EXPECT_EQ(nodes_[1]->ExistsCount(keys), 12u);
}

// A re-announcement (HoldingsAnnouncer::Republish) tells the homes again of
// everything held in the shards asked, counted; cancelled, it stops there.
TEST_F(RemoteReaderTest, RepublishTellsTheHomesAgainAndStopsWhenCancelled) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  constexpr uint64_t kN = 3000;
  for (uint64_t i = 0; i < kN; ++i) a.Put(Key(100000 + i), Bytes(i, 64));
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(kN));
  // The homes forget (as after a restart of theirs).
  for (auto& n : nodes_) n->directory->Clear();
  ASSERT_TRUE(WaitDirectoryEntries(0));

  // Only the shards asked for.
  const std::vector<bool> all(kNumShards, true);
  std::vector<bool> half(kNumShards, false);
  uint64_t in_half = 0;
  for (uint32_t s = 0; s < kNumShards; s += 2) half[s] = true;
  for (uint64_t i = 0; i < kN; ++i) in_half += half[ShardOf(Key(100000 + i))] ? 1 : 0;
  auto sent = a.announcer->Republish(half, [] { return false; });
  EXPECT_EQ(sent.dram, in_half);
  EXPECT_EQ(sent.ssd, 0u);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(in_half));
  sent = a.announcer->Republish(all, [] { return false; });
  EXPECT_EQ(sent.dram, kN);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(kN));
  EXPECT_EQ(nodes_[2]->ExistsCount({Key(100000), Key(100000 + kN - 1)}), 2u);

  // Cancelled after 1000 keys: 1000 sent.
  int asked = 0;
  sent = a.announcer->Republish(all, [&] { return ++asked >= 1000; });
  EXPECT_EQ(sent.dram, 1000u);
  EXPECT_EQ(a.announcer->queued(), 1000u);
}

// The announcer's flushes run on its scheduler: with the manual twin
// nothing goes out until the test runs the flush, which then sends all.
TEST_F(RemoteReaderTest, TheAnnouncerFlushesOnItsSchedule) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  a.announcer->Stop();
  testing::ManualScheduler sched;
  HoldingsAnnouncerOptions ao;
  ao.publish_interval = milliseconds(5);
  ao.scheduler = &sched;
  a.announcer = std::make_unique<HoldingsAnnouncer>(ao, a.cluster.get(), a.directory.get(),
                                                    a.tiered.get(), a.pool.get(), &a.metrics);
  a.announcer->Start();
  for (int i = 0; i < 10; ++i) a.Put(Key(200 + i), Bytes(i, 4096));
  EXPECT_EQ(a.announcer->queued(), 10u);
  Clock::time_point due;
  ASSERT_TRUE(sched.NextDue(&due));
  EXPECT_EQ(due - sched.clock()->Now(), milliseconds(5));
  ASSERT_TRUE(sched.RunNext());  // the flush, 5 ms on
  EXPECT_EQ(a.announcer->queued(), 0u);
  ASSERT_TRUE(WaitDirectoryEntries(10));
  a.announcer->Stop();  // its job goes with it
  EXPECT_FALSE(sched.RunNext());
}

// Anti-entropy's rounds run on its scheduler, the first at once, each next
// one an interval after: a round finds the keys the homes lost and
// publishes them again, and finds nothing to do when nothing was lost.
TEST_F(RemoteReaderTest, AntiEntropyRoundsOnTheSchedulerRepairLostEntries) {
  nodes_[1]->gate->Open();
  testing::ManualScheduler sched;
  for (auto& n : nodes_) n->StartAntiEntropy(&sched);
  // The first rounds, due now: the static members learn each other's
  // incarnations from the digests (a view change each, before any key).
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sched.RunNext());
  ASSERT_TRUE(WaitFor([&] {
    for (auto& n : nodes_) {
      for (const Member& m : n->cluster->view()->members) {
        if (m.incarnation != 1) return false;
      }
    }
    return true;
  }));
  TestNode& a = *nodes_[0];
  std::vector<KeyId> keys;
  for (int i = 0; i < 64; ++i) {
    keys.push_back(Key(300 + i));
    a.Put(keys.back(), Bytes(i, 4096));
  }
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  auto republished = [&] { return a.metrics.ValueOf("kvpool_anti_entropy_republished_total"); };
  const double before = republished();
  Clock::time_point due;
  ASSERT_TRUE(sched.NextDue(&due));
  EXPECT_EQ(due - sched.clock()->Now(), milliseconds(5000));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sched.RunNext());  // 5 s on: nothing lost
  EXPECT_EQ(republished(), before);
  EXPECT_EQ(a.announcer->queued(), 0u);

  for (auto& n : nodes_) n->directory->Clear();  // the homes lose their entries
  ASSERT_TRUE(WaitDirectoryEntries(0));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sched.RunNext());  // 5 s on again
  EXPECT_EQ(republished() - before, static_cast<double>(keys.size()));
  EXPECT_EQ(a.announcer->queued(), keys.size());  // A's keys, published again
  EXPECT_EQ(a.metrics.ValueOf("kvpool_anti_entropy_rounds_total"), 3);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  EXPECT_EQ(nodes_[2]->ExistsCount(keys), keys.size());
  for (auto& n : nodes_) n->anti_entropy->Stop();  // before its scheduler goes
}

// A batch is a block chain in order and the holder touches each value it
// serves: the keys are fetched last to first, whichever homes resolved
// them, so the chain's head is the most recent of them on the holder, as
// after a local read.
TEST_F(RemoteReaderTest, FetchesTheWholeBatchLastToFirst) {
  nodes_[1]->gate->Open();
  TestNode& b = *nodes_[1];
  // Keys of every home: B's own directory and two remote lookups.
  const auto keys = PutOnA(500, 12, [](const std::string&) { return true; });
  ASSERT_EQ(keys.size(), 12u);
  auto map = b.cluster->shard_map();
  std::set<std::string> homes;
  for (const KeyId& k : keys) homes.insert(map->HomeOf(k)->node_id);
  ASSERT_EQ(homes.size(), 3u);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  auto pins = b.Fetch(keys);
  ASSERT_EQ(pins.size(), keys.size());
  const std::vector<KeyId> want(keys.rbegin(), keys.rend());
  EXPECT_EQ(b.gate->fetched(), want);
}

// Under a policy that touches a batch first to last (lru), a read fetches
// first to last, as a local read touches it: the holder keeps the order
// its own reads would.
TEST(RemoteReaderLruTest, FetchesFirstToLastUnderLru) {
  ManualClock clock;
  transport::InProcessNetwork net;
  std::vector<Member> members;
  for (const char* id : {"a", "b", "c"}) members.push_back({id, std::string(id) + ":1", 0, 1.0});
  std::vector<std::unique_ptr<TestNode>> nodes;
  for (const char* id : {"a", "b", "c"}) {
    nodes.push_back(std::make_unique<TestNode>(
        &net, id, members, &clock, std::string(id) == "b" ? "c:1" : "", false, false, "lru"));
  }
  TestNode& a = *nodes[0];
  TestNode& b = *nodes[1];
  b.gate->Open();  // only to record the fetches
  std::vector<KeyId> keys;
  for (int i = 0; i < 12; ++i) {
    keys.push_back(Key(600 + i));
    a.Put(keys.back(), Bytes(600 + i, 4096));
  }
  for (auto& n : nodes) n->announcer->Flush();
  uint64_t listed = 0;
  WaitFor(
      [&] {
        listed = 0;
        for (auto& n : nodes) listed += n->directory->entries();
        return listed >= keys.size();
      },
      milliseconds(2000));
  ASSERT_EQ(listed, keys.size());
  auto pins = b.Fetch(keys);
  ASSERT_EQ(pins.size(), keys.size());
  EXPECT_EQ(b.gate->fetched(), keys);
}

// A key the lookup named a holder of, gone from that holder by the fetch
// (dropped since; here the lookup was B's cached answer), was dropped
// lately: written again, it is a block coming back.
TEST_F(RemoteReaderTest, AKeyGoneFromTheHolderItsLookupNamedWasEvictedLately) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  TestNode& b = *nodes_[1];
  const std::vector<KeyId> keys = {Key(700), Key(701)};
  for (int i = 0; i < 2; ++i) a.Put(keys[i], Bytes(700 + i, 4096));
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  ASSERT_EQ(b.ExistsCount(keys), keys.size());
  // A drops the first; the homes do not know yet (nothing is flushed).
  ASSERT_TRUE(a.tiered->Remove(keys[0]).ok());
  auto pins = b.Fetch(keys);
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(b.Read(pins[0]), Bytes(701, 4096));
  EXPECT_TRUE(b.reader->EvictedLately(keys[0]));
  EXPECT_FALSE(b.reader->EvictedLately(keys[1]));  // read
  EXPECT_FALSE(b.reader->EvictedLately(Key(799)));  // never held
}

// A positive lookup answer is reused for --peer-lookup-cache-ttl (1 s) while
// fetches find what answers name. A fetch that finds every holder a cached
// answer named without the value halves that time, and each fetch served
// grows it by 1/4096: a pool that churns fast reads fewer values dropped
// since their lookup, and one whose values stay put keeps the whole TTL.
TEST_F(RemoteReaderTest, AStaleCachedAnswerHalvesHowLongAnswersAreReused) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  TestNode& b = *nodes_[1];
  // Remote homes only: B caches their answers.
  const auto keys = PutOnA(900, 6, [](const std::string& home) { return home != "b"; });
  ASSERT_EQ(keys.size(), 6u);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  Gauge* ttl = b.metrics.GetGauge("kvpool_remote_lookup_cache_ttl_microseconds", "");
  Counter* cached = b.metrics.GetCounter("kvpool_remote_lookup_cache_hits_total", "");
  Counter* stale = b.metrics.GetCounter("kvpool_remote_lookup_stale_answers_total", "");
  EXPECT_EQ(ttl->Value(), 1000000);

  // Answers reused for the whole second: served fetches change nothing.
  ASSERT_EQ(b.ExistsCount(keys), keys.size());
  clock_.Advance(milliseconds(900));
  ASSERT_EQ(b.ExistsCount(keys), keys.size());
  EXPECT_EQ(cached->Value(), keys.size());
  auto pins = b.Fetch({keys[1]});
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(b.Read(pins[0]), Bytes(901, 4096));
  pins.clear();
  EXPECT_EQ(ttl->Value(), 1000000);
  EXPECT_EQ(stale->Value(), 0u);

  // A drops keys[0]; its home does not know yet (nothing is flushed), and
  // B's cached answer still names A.
  ASSERT_TRUE(a.tiered->Remove(keys[0]).ok());
  EXPECT_TRUE(b.Fetch({keys[0]}).empty());
  EXPECT_EQ(stale->Value(), 1u);
  EXPECT_EQ(ttl->Value(), 500000);

  // Answers now last half a second.
  const std::vector<KeyId> rest(keys.begin() + 2, keys.end());
  const uint64_t before = cached->Value();
  clock_.Advance(milliseconds(1100));
  ASSERT_EQ(b.ExistsCount(rest), rest.size());  // asked the homes
  EXPECT_EQ(cached->Value(), before);
  clock_.Advance(milliseconds(450));
  ASSERT_EQ(b.ExistsCount(rest), rest.size());
  EXPECT_EQ(cached->Value(), before + rest.size());
  clock_.Advance(milliseconds(100));  // 550 ms after the homes answered
  ASSERT_EQ(b.ExistsCount(rest), rest.size());
  EXPECT_EQ(cached->Value(), before + rest.size());  // asked again

  // Each fetch served grows it by 1/4096 (at the whole TTL it stays: above).
  pins = b.Fetch(rest);
  ASSERT_EQ(pins.size(), rest.size());
  int64_t want = 500000;
  for (size_t i = 0; i < rest.size(); ++i) want += want / 4096;
  EXPECT_EQ(ttl->Value(), want);
}

// Answers are reused at most a sixteenth of how long keys stay listed at
// the reader's own directory (its entries over the departures per second,
// sampled every 250 ms): where values churn, a cached answer would name a
// holder that dropped the value, and an exists call believing it would stop
// a writer from writing the block again.
TEST_F(RemoteReaderTest, ChurnAtTheReadersDirectoryBoundsHowLongAnswersAreReused) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  TestNode& b = *nodes_[1];
  const auto keys = PutOnA(1000, 6, [](const std::string& home) { return home != "b"; });
  const auto listed_at_b = PutOnA(1200, 8, [](const std::string& home) { return home == "b"; });
  ASSERT_EQ(keys.size(), 6u);
  ASSERT_EQ(listed_at_b.size(), 8u);
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size() + listed_at_b.size()));
  ASSERT_EQ(b.directory->entries(), 8u);
  Gauge* ttl = b.metrics.GetGauge("kvpool_remote_lookup_cache_ttl_microseconds", "");
  Counter* cached = b.metrics.GetCounter("kvpool_remote_lookup_cache_hits_total", "");

  ASSERT_EQ(b.ExistsCount(keys), keys.size());  // the first sample; answers cached
  EXPECT_EQ(cached->Value(), 0u);
  // A drops 4 of the 8 keys listed at B: 4 listed, 4 gone in 250 ms, so a
  // key stays listed about 250 ms and answers are reused 15.625 ms.
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(a.tiered->Remove(listed_at_b[i]).ok());
  FlushAll();
  WaitFor([&] { return b.directory->entries() == 4; }, milliseconds(2000));
  ASSERT_EQ(b.directory->entries(), 4u);
  EXPECT_EQ(b.directory->departures(), 4u);
  clock_.Advance(milliseconds(250));
  ASSERT_EQ(b.ExistsCount(keys), keys.size());  // 250 ms old: asked the homes
  EXPECT_EQ(cached->Value(), 0u);
  EXPECT_EQ(ttl->Value(), 15625);
  clock_.Advance(milliseconds(15));
  ASSERT_EQ(b.ExistsCount(keys), keys.size());  // reused
  EXPECT_EQ(cached->Value(), keys.size());
  clock_.Advance(milliseconds(1));  // 16 ms after the homes answered
  ASSERT_EQ(b.ExistsCount(keys), keys.size());
  EXPECT_EQ(cached->Value(), keys.size());  // asked again

  // A quarter of a second without departures: the whole TTL again.
  clock_.Advance(milliseconds(250));
  ASSERT_EQ(b.ExistsCount(keys), keys.size());
  EXPECT_EQ(ttl->Value(), 1000000);
  clock_.Advance(milliseconds(900));
  ASSERT_EQ(b.ExistsCount(keys), keys.size());
  EXPECT_EQ(cached->Value(), 2 * keys.size());
}

TEST_F(RemoteReaderTest, PlacementHomeMovesValuesToTheirHomeOrKeepsThemWhenItIsDown) {
  nodes_[1]->gate->Open();
  std::vector<Member> members;
  for (const char* id : {"a", "b", "c"}) members.push_back({id, std::string(id) + ":1", 0, 1.0});
  nodes_[0].reset();  // A again, with placement home
  nodes_[0] = std::make_unique<TestNode>(&net_, "a", members, &clock_, "", false,
                                         /*placement_home=*/true);
  TestNode& a = *nodes_[0];
  TestNode& b = *nodes_[1];
  Tee a_events(a.announcer.get()), b_events(b.announcer.get());
  a.tiered->SetHoldingsObserver(&a_events);
  b.tiered->SetHoldingsObserver(&b_events);
  auto map = a.cluster->shard_map();
  std::vector<KeyId> to_b, to_c;
  for (int i = 0; to_b.size() < 8 || to_c.size() < 8; ++i) {
    KeyId k = Key(5000 + i);
    const std::string& home = map->HomeOf(k)->node_id;
    if (home == "b" && to_b.size() < 8) to_b.push_back(k);
    if (home == "c" && to_c.size() < 8) to_c.push_back(k);
  }
  nodes_[2].reset();  // C is down
  auto put = [&](const KeyId& k, uint64_t seed) {
    auto v = Bytes(seed, 4096);
    auto r = a.tiered->Reserve(k, v.size());
    ASSERT_TRUE(r.ok());
    std::memcpy(r->data(), v.data(), v.size());
    ASSERT_TRUE(a.tiered->Commit(std::move(r).value()).ok());  // placed by the announcer
  };
  for (size_t i = 0; i < to_b.size(); ++i) put(to_b[i], i);
  for (size_t i = 0; i < to_c.size(); ++i) put(to_c[i], 100 + i);
  Counter* moved = a.metrics.GetCounter("kvpool_placement_moved_total", "");
  Counter* kept = a.metrics.GetCounter("kvpool_placement_kept_total", "");
  WaitFor([&] { return moved->Value() + kept->Value() >= 16; }, milliseconds(3000));
  EXPECT_EQ(moved->Value(), 8u);
  EXPECT_EQ(kept->Value(), 8u);
  for (size_t i = 0; i < to_b.size(); ++i) {
    EXPECT_NE(a.tiered->Where(to_b[i]), HoldingTier::kDram) << i;  // handed over
    auto p = b.tiered->Acquire(to_b[i]);
    ASSERT_TRUE(p.ok()) << i;
    EXPECT_EQ(b.Read(*p), Bytes(i, 4096)) << i;
  }
  for (const auto& k : to_c)
    EXPECT_EQ(a.tiered->Where(k), HoldingTier::kDram);  // kept: the home is down

  // The holdings stream: A wrote 16 and handed 8 off; B took 8 placed. Only
  // the 8 kept are published by A (its hand-offs never were); B publishes
  // the 8 it holds, into its own directory before answering.
  using W = HoldingsEvent::Why;
  EXPECT_EQ(a_events.Count(W::kWritten), 16u);
  EXPECT_EQ(a_events.Count(W::kHandedOff), 8u);
  EXPECT_EQ(b_events.Count(W::kWritten, WriteOrigin::kPlaced), 8u);
  EXPECT_EQ(b_events.Count(W::kWritten), 0u);
  EXPECT_EQ(a.metrics.ValueOf("kvpool_publish_queued_total", {{"op", "add"}}), 8);
  EXPECT_EQ(a.metrics.ValueOf("kvpool_publish_queued_total", {{"op", "remove"}}), 0);
  EXPECT_EQ(b.metrics.ValueOf("kvpool_publish_queued_total", {{"op", "add"}}), 8);
  EXPECT_EQ(b.directory->entries(), 8u);
  for (const LookupResult& r : b.directory->Lookup(to_b)) {
    ASSERT_EQ(r.holders.size(), 1u);  // B itself
  }

  // Removing a kept value at A unpublishes it; one handed off is not here.
  ASSERT_TRUE(a.tiered->Remove(to_c[0]).ok());
  EXPECT_EQ(a.tiered->Remove(to_b[0]).code(), StatusCode::kNotFound);
  EXPECT_EQ(a_events.Count(W::kRemoved), 1u);
  EXPECT_EQ(a.metrics.ValueOf("kvpool_publish_queued_total", {{"op", "remove"}}), 1);
  a.tiered->SetHoldingsObserver(a.announcer.get());
  b.tiered->SetHoldingsObserver(b.announcer.get());
}

// A publish batch the home did not take (b is down) is sent again after the
// retry delay, to the key's home as of then: b, back, gets every entry.
TEST_F(RemoteReaderTest, APublishTheHomeDidNotTakeIsSentAgain) {
  TestNode& a = *nodes_[0];
  auto map = a.cluster->shard_map();
  std::vector<KeyId> keys;
  for (int i = 0; keys.size() < 8 && i < 1000; ++i) {
    if (map->HomeOf(Key(i))->node_id == "b") keys.push_back(Key(i));
  }
  ASSERT_EQ(keys.size(), 8u);
  nodes_[1].reset();  // b goes away; its address stops answering
  for (size_t i = 0; i < keys.size(); ++i) a.Put(keys[i], Bytes(static_cast<int>(i), 4096));
  a.announcer->Flush();
  WaitFor(
      [&] {
        return a.metrics.ValueOf("kvpool_peer_errors_total", {{"op", "publish"}}) >= 1;
      },
      milliseconds(2000));
  ASSERT_GE(a.metrics.ValueOf("kvpool_peer_errors_total", {{"op", "publish"}}), 1);
  std::vector<Member> members;
  for (const char* id : {"a", "b", "c"}) members.push_back({id, std::string(id) + ":1", 0, 1.0});
  nodes_[1] = std::make_unique<TestNode>(&net_, "b", members, &clock_, "c:1");
  a.announcer->Flush();  // before the retry delay: nothing is due yet
  EXPECT_EQ(a.metrics.ValueOf("kvpool_publish_retried_total"), 0);
  clock_.Advance(milliseconds(250));  // past the retry delay (200 ms)
  a.announcer->Flush();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));
  EXPECT_EQ(nodes_[1]->directory->entries(), keys.size());
  EXPECT_EQ(a.metrics.ValueOf("kvpool_publish_retried_total"), 8);
  EXPECT_EQ(a.metrics.ValueOf("kvpool_publish_dropped_total"), 0);
}

// A read fetches once every home has answered its lookup, so the whole
// chain is fetched last to first (above): while the lookup at C is held, no
// key is fetched, not even those B's own directory resolved at once; the
// read completes once C answers.
TEST_F(RemoteReaderTest, FetchesWaitForEveryHomesAnswer) {
  TestNode& a = *nodes_[0];
  TestNode& b = *nodes_[1];
  b.SetReplicas(RemoteReaderOptions::Replicas::kAll);  // read back below
  auto map = b.cluster->shard_map();
  std::vector<KeyId> keys;
  std::vector<std::vector<uint8_t>> vals;
  size_t homed_b = 0, homed_c = 0;
  for (int i = 0; keys.size() < 24 && i < 1000; ++i) {
    const std::string& home = map->HomeOf(Key(i))->node_id;
    if (home == "a") continue;
    if (home == "b" && homed_b == 12) continue;
    if (home == "c" && homed_c == 12) continue;
    ++(home == "b" ? homed_b : homed_c);
    keys.push_back(Key(i));
    vals.push_back(Bytes(i, 8192));
    a.Put(keys.back(), vals.back());
  }
  ASSERT_EQ(homed_b, 12u);
  ASSERT_EQ(homed_c, 12u);
  a.announcer->Flush();
  ASSERT_TRUE(WaitDirectoryEntries(keys.size()));

  std::promise<std::vector<TieredStore::Pin>> done;
  auto f = done.get_future();
  b.reader->Fetch(keys, [&](std::vector<TieredStore::Pin> pins) { done.set_value(std::move(pins)); });
  Counter* hits = b.metrics.GetCounter("kvpool_remote_hits_total", "");
  WaitFor([&] { return b.gate->held() >= 1; }, milliseconds(5000));
  ASSERT_EQ(b.gate->held(), 1u);  // C's lookup
  // B resolved its 12 at once, and waits: it fetches nothing meanwhile
  // (watched for 200 ms).
  EXPECT_FALSE(WaitFor([&] { return !b.gate->fetched().empty(); }, milliseconds(200)));
  EXPECT_EQ(b.gate->fetched().size(), 0u);
  EXPECT_EQ(hits->Value(), 0u);
  EXPECT_EQ(f.wait_for(milliseconds(0)), std::future_status::timeout);

  b.gate->Open();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto pins = f.get();
  ASSERT_EQ(pins.size(), keys.size());
  EXPECT_EQ(hits->Value(), keys.size());
  EXPECT_EQ(b.gate->fetched(), std::vector<KeyId>(keys.rbegin(), keys.rend()));
  for (size_t i = 0; i < keys.size(); ++i) {
    auto p = b.tiered->Acquire(keys[i]);
    ASSERT_TRUE(p.ok()) << i;
    EXPECT_EQ(b.Read(*p), vals[i]) << i;
  }
  // A lets go of the entries it answered from once the replies are sent (on
  // the network thread, possibly just after B got them).
  WaitFor([&] { return a.tiered->GetDramStats().pinned == 0; }, milliseconds(5000));
  EXPECT_EQ(a.tiered->GetDramStats().pinned, 0u);
}

// A degraded network on C's calls (RELIABILITY B5, scaled down): a delay of
// 75 +- 50 ms on every call, then half of them dropped, then 200 ms more to
// A only, then none. Every Fetch finishes within its lookup and fetch
// deadlines (300 ms each) plus 300 ms, every value it returns is
// byte-exact, and once the faults end the reads hit again.
TEST_F(RemoteReaderTest, DegradedNetworkCostsMissesNeverHangsOrWrongBytes) {
  nodes_[1]->gate->Open();
  TestNode& a = *nodes_[0];
  TestNode& c = *nodes_[2];
  constexpr int kN = 48, kBatch = 8;
  std::vector<KeyId> keys;
  std::vector<std::vector<uint8_t>> vals;
  for (int i = 0; i < kN; ++i) {
    keys.push_back(Key(5000 + i));
    vals.push_back(Bytes(5000 + i, 1 + (i * 7919) % 65536));
    a.Put(keys.back(), vals.back());
  }
  FlushAll();
  ASSERT_TRUE(WaitDirectoryEntries(kN));
  transport::FaultTransport& fault = c.faulty->fault();

  struct Outcome {
    int hits = 0, wrong = 0;
    int64_t max_ms = 0;
  };
  // Every key read through C in batches; C's replicas are removed after
  // each batch, so every phase reads from A again. Each batch starts after
  // the cool-downs (2 s) of the one before are over: the clock is moved
  // past them, not waited out.
  auto read_all = [&] {
    Outcome o;
    for (int off = 0; off < kN; off += kBatch) {
      clock_.Advance(milliseconds(2001));
      std::vector<KeyId> batch(keys.begin() + off, keys.begin() + off + kBatch);
      auto t0 = std::chrono::steady_clock::now();
      auto pins = c.Fetch(batch);
      o.max_ms = std::max<int64_t>(
          o.max_ms, std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0)
                        .count());
      for (const auto& p : pins) {
        auto got = c.Read(p);
        bool matched = false;
        for (int i = off; i < off + kBatch; ++i) matched |= got == vals[i];
        o.wrong += matched ? 0 : 1;
      }
      o.hits += static_cast<int>(pins.size());
      pins.clear();
      for (const auto& k : batch) c.tiered->Remove(k).IgnoreError();
    }
    return o;
  };
  constexpr int64_t kBoundMs = 300 + 300 + 300;

  transport::FaultRule slow;
  slow.delay = milliseconds(25);
  slow.jitter = milliseconds(100);  // 25..125 ms: well inside each deadline
  fault.SetDefaultRule(slow);
  Outcome delayed = read_all();
  EXPECT_EQ(delayed.wrong, 0);
  EXPECT_LE(delayed.max_ms, kBoundMs);
  // Delays under the deadlines cost nothing, but for slack for a loaded
  // machine: a call starved past its 175 ms margin is a miss, not an error,
  // and it misses its whole batch, so the slack is one batch of the six.
  EXPECT_GE(delayed.hits, kN - kBatch);

  transport::FaultRule lossy;
  lossy.drop_probability = 0.5;
  fault.SetDefaultRule(lossy);
  Outcome dropped = read_all();
  EXPECT_EQ(dropped.wrong, 0);
  EXPECT_LE(dropped.max_ms, kBoundMs);
  EXPECT_LT(dropped.hits, kN);  // lost calls are misses (and their peers cool down)
  EXPECT_GT(c.metrics.GetCounter("kvpool_peer_cooldowns_total", "")->Value(), 0u);

  // 200 ms more one way to A only.
  fault.ClearRules();
  transport::FaultRule far;
  far.delay = milliseconds(200);
  fault.SetRule(a.cluster->transport()->address(), far);
  Outcome one_slow = read_all();
  EXPECT_EQ(one_slow.wrong, 0);
  EXPECT_LE(one_slow.max_ms, kBoundMs);
  EXPECT_GE(one_slow.hits, kN - kBatch);  // the same slack: one batch

  // Healed: every key hits again.
  fault.ClearRules();
  Outcome healed;
  for (int i = 0; i < 10 && healed.hits < kN; ++i) {
    healed = read_all();
    EXPECT_EQ(healed.wrong, 0);
  }
  EXPECT_EQ(healed.hits, kN);
  std::printf(
      "SUMMARY {\"test\":\"degraded_network\",\"keys\":%d,\"bound_ms\":%lld,"
      "\"delay_hits\":%d,\"delay_max_ms\":%lld,\"drop_hits\":%d,\"drop_max_ms\":%lld,"
      "\"one_slow_hits\":%d,\"one_slow_max_ms\":%lld,\"healed_hits\":%d,\"wrong\":%d}\n",
      kN, static_cast<long long>(kBoundMs), delayed.hits, static_cast<long long>(delayed.max_ms),
      dropped.hits, static_cast<long long>(dropped.max_ms), one_slow.hits,
      static_cast<long long>(one_slow.max_ms), healed.hits,
      delayed.wrong + dropped.wrong + one_slow.wrong + healed.wrong);
}

}  // namespace
}  // namespace kvpool::cluster
