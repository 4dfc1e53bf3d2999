// A get that parks (its keys wait for the cluster or a promotion) is
// decoded once and pins each key once: the request carries its decoded keys
// and the pins its wait took, and is answered from them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "common/executor.h"
#include "kvpool/kvpool.h"
#include "node/local_server.h"
#include "node/parked_reads.h"
#include "store/tiered_store.h"

namespace kvpool {
namespace {

// A parked request cannot carry its frame body: only decoded keys.
template <typename R>
concept CarriesBody = requires(R r) { r.body; };
static_assert(!CarriesBody<ParkedReads::Request>);

// The cluster as the local server sees it: values "held elsewhere", copied
// into the local store on Fetch (as RemoteReader does), on another thread.
class FakeCluster final : public RemoteReads, public RemotePlacement {
 public:
  FakeCluster(TieredStore* store, Executor* executor) : store_(store), executor_(executor) {}
  void Hold(const KeyId& key, std::vector<uint8_t> value) { values_[key] = std::move(value); }
  // Another node dropped it (between a test's calls).
  void Drop(const KeyId& key) { values_.erase(key); }

  void Fetch(std::vector<KeyId> keys, FetchDone done) override {
    executor_->Submit([this, keys = std::move(keys), done = std::move(done)] {
      std::vector<TieredStore::Pin> pins;
      for (const KeyId& k : keys) {
        auto it = values_.find(k);
        if (it == values_.end()) continue;
        auto r = store_->Reserve(k, it->second.size());
        if (!r.ok()) continue;
        std::memcpy(r->data(), it->second.data(), it->second.size());
        auto pin = store_->CommitAndAcquire(std::move(r).value(), WriteOrigin::kCopy);
        if (pin.ok()) pins.push_back(std::move(pin).value());
      }
      done(std::move(pins));
    });
  }
  void NoteChain(const KeyId* before, std::span<const KeyId> keys) override {
    std::lock_guard lock(mu_);
    notes_.push_back({before != nullptr ? std::optional<KeyId>(*before) : std::nullopt,
                      std::vector<KeyId>(keys.begin(), keys.end())});
  }
  struct Note {
    std::optional<KeyId> before;
    std::vector<KeyId> keys;
  };
  std::vector<Note> notes() {
    std::lock_guard lock(mu_);
    return notes_;
  }
  // Each call, with the entries the store held then; it takes 20 ms, so a
  // put answered before it had returned finds nothing recorded yet.
  void PublishNow() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard lock(mu_);
    published_.push_back(store_->GetDramStats().entries);
  }
  std::vector<uint64_t> published() {
    std::lock_guard lock(mu_);
    return published_;
  }
  // Nothing goes elsewhere, and nothing was dropped lately.
  bool Forward(const KeyId&, std::span<const uint8_t>) override { return false; }
  bool WouldForward(const KeyId&) const override { return false; }
  bool EvictedLately(const KeyId&) const override { return false; }
  void Exists(std::vector<KeyId> keys, ExistsDone done) override {
    executor_->Submit([this, keys = std::move(keys), done = std::move(done)] {
      std::vector<KeyId> hits;
      for (const KeyId& k : keys) {
        if (values_.count(k) > 0) hits.push_back(k);
      }
      done(std::move(hits));
    });
  }

 private:
  TieredStore* const store_;
  Executor* const executor_;
  std::map<KeyId, std::vector<uint8_t>> values_;  // changed only between the test's calls
  std::mutex mu_;
  std::vector<Note> notes_;  // protected by mu_
  std::vector<uint64_t> published_;  // protected by mu_
};

std::vector<uint8_t> Value(int seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 13 + i * 7);
  return v;
}

// The ids of keys PREFIX0 .. PREFIX(n-1) in namespace ns.
std::vector<kvpool_key_id> NamedIds(const std::string& ns, const std::string& prefix, int n) {
  std::vector<kvpool_key_id> ids(n);
  for (int i = 0; i < n; ++i) {
    std::string name = prefix + std::to_string(i);
    const void* key = name.data();
    size_t len = name.size();
    kvpool_key_ids(ns.data(), ns.size(), &key, &len, 1, &ids[i]);
  }
  return ids;
}

// Puts ids[first..first+n) with values Value(first + i, 4096).
void PutValues(kvpool_client* client, const kvpool_key_id* ids, int first, int n) {
  std::vector<std::vector<uint8_t>> v;
  std::vector<const void*> src;
  std::vector<uint64_t> sizes(n, 4096);
  std::vector<kvpool_status> statuses(n);
  for (int i = 0; i < n; ++i) v.push_back(Value(first + i, 4096));
  for (auto& b : v) src.push_back(b.data());
  EXPECT_EQ(kvpool_put(client, &ids[first], src.data(), sizes.data(), n, statuses.data()),
            KVPOOL_OK);
}

// A 16 MiB DRAM store without an SSD tier.
Result<std::unique_ptr<TieredStore>> OpenStore(ThreadPool* pool, MetricsRegistry* metrics) {
  DramOptions d;
  d.capacity_bytes = 16 << 20;
  d.slab_bytes = 1 << 20;
  d.max_value_bytes = 1 << 20;
  d.huge_pages = false;
  d.prefault = false;
  return TieredStore::Open(d, nullptr, pool, pool, TieringOptions{}, metrics);
}

// A LocalServer over the store and the fake cluster, on a socket in a fresh
// directory, run on its own thread; and a client of it. Stop() before the
// cluster's pool stops.
class Served {
 public:
  void Start(const std::string& name, TieredStore* store, FakeCluster* cluster,
             MetricsRegistry* metrics, bool copy_mode) {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvpool-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    LocalServerOptions lo;
    lo.socket_path = dir_ + "/kvpool.sock";
    auto server = LocalServer::Open(lo, store, ClusterFaces{cluster, cluster}, metrics,
                                    [] { return std::string("{}"); });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    loop_ = std::thread([this] { server_->Run(); });
    kvpool_options o;
    kvpool_options_init(&o);
    o.socket_path = lo.socket_path.c_str();
    o.copy_mode = copy_mode ? 1 : 0;
    kvpool_status st;
    client_ = kvpool_open(&o, &st);
    ASSERT_NE(client_, nullptr);
  }
  kvpool_client* client() const { return client_; }
  void Stop() {
    if (client_ != nullptr) kvpool_close(client_);
    client_ = nullptr;
    if (server_ != nullptr) server_->Stop();
    if (loop_.joinable()) loop_.join();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }
  ~Served() { Stop(); }

 private:
  std::string dir_;
  std::unique_ptr<LocalServer> server_;
  std::thread loop_;
  kvpool_client* client_ = nullptr;
};

// Reads ids in one request: a copy-mode get, or a zero-copy acquire whose
// regions are copied out and released. Values up to 8 KiB.
void ReadAll(kvpool_client* client, const std::vector<kvpool_key_id>& ids, bool copy_mode,
             std::vector<kvpool_status>* statuses, std::vector<std::vector<uint8_t>>* got) {
  const size_t n = ids.size();
  statuses->assign(n, KVPOOL_OK);
  got->assign(n, std::vector<uint8_t>(8192));
  if (copy_mode) {
    std::vector<void*> bufs;
    std::vector<uint64_t> caps(n, 8192), sizes(n, 0);
    for (auto& g : *got) bufs.push_back(g.data());
    ASSERT_EQ(
        kvpool_get(client, ids.data(), bufs.data(), caps.data(), n, sizes.data(), statuses->data()),
        KVPOOL_OK);
    for (size_t i = 0; i < n; ++i) (*got)[i].resize(sizes[i]);
    return;
  }
  std::vector<kvpool_region> regions(n);
  ASSERT_EQ(kvpool_acquire(client, ids.data(), n, regions.data(), statuses->data()), KVPOOL_OK);
  std::vector<uint64_t> handles;
  for (size_t i = 0; i < n; ++i) {
    if ((*statuses)[i] != KVPOOL_OK) continue;
    const uint8_t* p = static_cast<const uint8_t*>(regions[i].data);
    (*got)[i].assign(p, p + regions[i].size);
    handles.push_back(regions[i].handle);
  }
  ASSERT_EQ(kvpool_release(client, handles.data(), handles.size()), KVPOOL_OK);
}

class ParkedGetTest : public ::testing::TestWithParam<bool> {};

// Two keys held here and two held only elsewhere, read in one request
// (zero-copy acquire or copy-mode get): every key is pinned exactly once
// on the node and the reply is byte-exact.
TEST_P(ParkedGetTest, DecodedOnceAndEachKeyPinnedOnce) {
  const bool copy_mode = GetParam();
  MetricsRegistry metrics;
  ThreadPool pool(2, "test-cluster");
  auto store = OpenStore(&pool, &metrics);
  ASSERT_TRUE(store.ok());
  TieredStore* s = store->get();
  FakeCluster cluster(s, &pool);

  std::vector<kvpool_key_id> ids(4);
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < 4; ++i) {
    std::string name = "k" + std::to_string(i);
    const void* key = name.data();
    size_t len = name.size();
    kvpool_key_ids("parked", 6, &key, &len, 1, &ids[i]);
    values.push_back(Value(i, 4096 + i));
    KeyId k{ids[i].hi, ids[i].lo};
    if (i % 2 == 0) {  // held here
      auto r = s->Reserve(k, values[i].size());
      ASSERT_TRUE(r.ok());
      std::memcpy(r->data(), values[i].data(), values[i].size());
      ASSERT_TRUE(s->Commit(std::move(r).value()).ok());
    } else {
      cluster.Hold(k, values[i]);
    }
  }

  Served served;
  ASSERT_NO_FATAL_FAILURE(
      served.Start(copy_mode ? "parked-c" : "parked-z", s, &cluster, &metrics, copy_mode));
  kvpool_client* client = served.client();

  const double pins_before = metrics.ValueOf("kvpool_dram_hits_total");
  const double items_before = metrics.ValueOf("kvpool_items_total");
  std::vector<kvpool_status> statuses;
  std::vector<std::vector<uint8_t>> got;
  ASSERT_NO_FATAL_FAILURE(ReadAll(client, ids, copy_mode, &statuses, &got));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(statuses[i], KVPOOL_OK) << i;
    EXPECT_EQ(got[i], values[i]) << i;
  }
  // One pin per key: the two held here when the request parked, the two
  // fetched copies when they were committed. Nothing pinned again.
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_hits_total") - pins_before, 4);
  // Its keys were decoded once (counted as they are decoded).
  EXPECT_EQ(metrics.ValueOf("kvpool_items_total") - items_before, 4);
  EXPECT_EQ(metrics.ValueOf("kvpool_remote_waits_total"), 1);

  served.Stop();
  pool.Stop();
}

INSTANTIATE_TEST_SUITE_P(ZeroCopyAndCopyMode, ParkedGetTest, ::testing::Bool());

// A read of a batch DRAM holds all of, in a cluster (where a key not held
// here would wait for the cluster), looks its keys up in one hold of the
// DRAM lock: TieredStore::ReadBatch, not a "cold?", a "here?" and a pin per
// key. Both read paths, byte-exact.
TEST_P(ParkedGetTest, DramHitsAreOneLookupPerBatch) {
  const bool copy_mode = GetParam();
  MetricsRegistry metrics;
  ThreadPool pool(2, "test-cluster");
  auto store = OpenStore(&pool, &metrics);
  ASSERT_TRUE(store.ok());
  TieredStore* s = store->get();
  FakeCluster cluster(s, &pool);
  Served served;
  ASSERT_NO_FATAL_FAILURE(
      served.Start(copy_mode ? "rounds-c" : "rounds-z", s, &cluster, &metrics, copy_mode));
  kvpool_client* client = served.client();
  constexpr int kN = 16;
  std::vector<kvpool_key_id> ids = NamedIds("rounds", "r", kN);
  PutValues(client, ids.data(), 0, kN);

  for (int round = 0; round < 3; ++round) {
    const uint64_t before = s->GetDramStats().lookup_rounds;
    std::vector<kvpool_status> statuses;
    std::vector<std::vector<uint8_t>> got;
    ASSERT_NO_FATAL_FAILURE(ReadAll(client, ids, copy_mode, &statuses, &got));
    EXPECT_EQ(s->GetDramStats().lookup_rounds - before, 1u) << "round " << round;
    for (int i = 0; i < kN; ++i) {
      EXPECT_EQ(statuses[i], KVPOOL_OK) << i;
      EXPECT_EQ(got[i], Value(i, 4096)) << i;
    }
  }
  EXPECT_EQ(metrics.ValueOf("kvpool_remote_waits_total"), 0);
  served.Stop();
  pool.Stop();
}

// A get that parks pins the keys held here while it waits; each pin is a
// hit, and they are taken last to first, so the chain's head is its most
// recent block and its tail the first to go, as after a get that does not
// wait.
TEST(ParkedGet, TheKeysHeldHereAreHitLastToFirst) {
  MetricsRegistry metrics;
  ThreadPool pool(2, "test-cluster");
  auto store = OpenStore(&pool, &metrics);
  ASSERT_TRUE(store.ok());
  TieredStore* s = store->get();
  FakeCluster cluster(s, &pool);
  constexpr size_t kValue = 64 << 10;
  auto id = [](const std::string& name) {
    const void* key = name.data();
    size_t len = name.size();
    kvpool_key_id out;
    kvpool_key_ids("order", 5, &key, &len, 1, &out);
    return out;
  };
  auto key = [&](const std::string& name) {
    kvpool_key_id i = id(name);
    return KeyId{i.hi, i.lo};
  };
  auto put = [&](const std::string& name) {
    auto r = s->Reserve(key(name), kValue);
    ASSERT_TRUE(r.ok()) << name;
    std::memset(r->data(), 1, kValue);
    ASSERT_TRUE(s->Commit(std::move(r).value()).ok()) << name;
  };
  auto touch = [&](const std::string& name) { ASSERT_TRUE(s->Acquire(key(name)).ok()) << name; };
  auto chain_present = [&] {
    std::string out;
    for (int i = 0; i < 10; ++i) out += s->Contains(key("c" + std::to_string(i))) ? '1' : '0';
    return out;
  };

  // The store's slots of this size: all but one filled, the chain's ten
  // last; one more block of the chain is held elsewhere.
  put("c0");
  const DramStats stats = s->GetDramStats();
  uint64_t slot_bytes = 0;
  for (const auto& c : stats.classes) {
    if (c.entries == 1) slot_bytes = c.slot_bytes;
  }
  ASSERT_GT(slot_bytes, 0u);
  const uint64_t slots = stats.capacity_bytes / slot_bytes;
  ASSERT_GT(slots, 64u);
  const uint64_t fillers = slots - 11;
  for (uint64_t i = 0; i < fillers; ++i) put("f" + std::to_string(i));
  for (int i = 1; i < 10; ++i) put("c" + std::to_string(i));
  cluster.Hold(key("c10"), std::vector<uint8_t>(kValue, 2));

  Served served;
  ASSERT_NO_FATAL_FAILURE(served.Start("parked-order", s, &cluster, &metrics, /*copy_mode=*/true));
  kvpool_client* client = served.client();

  // The chain read in one get: c10 is fetched, so the get parks and pins
  // c0..c9 while it waits. The store is full then.
  std::vector<kvpool_key_id> ids;
  for (int i = 0; i <= 10; ++i) ids.push_back(id("c" + std::to_string(i)));
  std::vector<std::vector<uint8_t>> bufs(11, std::vector<uint8_t>(kValue));
  std::vector<void*> dst;
  for (auto& b : bufs) dst.push_back(b.data());
  std::vector<uint64_t> caps(11, kValue), sizes(11, 0);
  std::vector<kvpool_status> statuses(11);
  ASSERT_EQ(
      kvpool_get(client, ids.data(), dst.data(), caps.data(), 11, sizes.data(), statuses.data()),
      KVPOOL_OK);
  for (int i = 0; i <= 10; ++i) ASSERT_EQ(statuses[i], KVPOOL_OK) << i;
  EXPECT_EQ(metrics.ValueOf("kvpool_remote_waits_total"), 1);
  ASSERT_EQ(s->GetDramStats().entries, slots);

  // Every filler hit after the chain: the chain is protected's coldest.
  for (uint64_t i = 0; i < fillers; ++i) touch("f" + std::to_string(i));
  // The next write enforces protected's share: its least recently used,
  // the chain first, go back to probation behind the fetched copy, which
  // leaves first; the write after that takes the chain's coldest block.
  put("n0");
  EXPECT_FALSE(s->Contains(key("c10")));
  EXPECT_EQ(chain_present(), "1111111111");
  put("n1");
  EXPECT_EQ(chain_present(), "1111111110");
  put("n2");
  EXPECT_EQ(chain_present(), "1111111100");

  served.Stop();
  pool.Stop();
}

// The put after a hit-prefix call writes the rest of the chain, and the
// cluster is told which key it follows: the last hit, or, when a hit was
// gone by the read (another node dropped it after its lookup), the hit
// before that one. A put the call did not lead to is not a chain.
TEST(ChainNote, ThePutAfterAnExistsContinuesItsChainEvenFromAHitGoneByTheRead) {
  MetricsRegistry metrics;
  ThreadPool pool(2, "test-cluster");
  auto store = OpenStore(&pool, &metrics);
  ASSERT_TRUE(store.ok());
  FakeCluster cluster(store->get(), &pool);
  const std::vector<kvpool_key_id> ids = NamedIds("chain", "c", 9);
  std::vector<KeyId> keys;
  for (const kvpool_key_id& id : ids) keys.push_back(KeyId{id.hi, id.lo});
  // Two chains of four: the first two blocks of each held elsewhere.
  for (int i : {0, 1, 4, 5}) cluster.Hold(keys[i], Value(i, 4096));

  Served served;
  ASSERT_NO_FATAL_FAILURE(
      served.Start("chain-note", store->get(), &cluster, &metrics, /*copy_mode=*/false));
  kvpool_client* client = served.client();

  auto exists_prefix = [&](int first) {
    std::vector<uint8_t> hits(4);
    size_t prefix = 0;
    EXPECT_EQ(kvpool_exists(client, &ids[first], 4, hits.data(), &prefix), KVPOOL_OK);
    return prefix;
  };
  auto put = [&](int first, int n) { PutValues(client, ids.data(), first, n); };

  // The rest written right after the hits: it follows the last hit.
  ASSERT_EQ(exists_prefix(0), 2u);
  put(2, 2);
  // The second hit is gone by the read: the rest is written from it, and
  // follows the first hit.
  ASSERT_EQ(exists_prefix(4), 2u);
  cluster.Drop(keys[5]);
  put(5, 3);
  // A put no exists call led to (the call's chain was written) is no chain.
  put(8, 1);

  const auto notes = cluster.notes();
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0].before, keys[1]);
  EXPECT_EQ(notes[0].keys, (std::vector<KeyId>{keys[2], keys[3]}));
  EXPECT_EQ(notes[1].before, keys[4]);
  EXPECT_EQ(notes[1].keys, (std::vector<KeyId>{keys[5], keys[6], keys[7]}));

  served.Stop();
  pool.Stop();
}

// A put or commit that stored values has the cluster publish them before it
// is answered (a request another node gets right after it finds them); one
// that stored nothing does not.
TEST(PublishNow, APutThatStoredIsPublishedBeforeItsAnswer) {
  MetricsRegistry metrics;
  ThreadPool pool(2, "test-cluster");
  auto store = OpenStore(&pool, &metrics);
  ASSERT_TRUE(store.ok());
  FakeCluster cluster(store->get(), &pool);
  const std::vector<kvpool_key_id> ids = NamedIds("publish", "p", 6);
  Served served;
  ASSERT_NO_FATAL_FAILURE(
      served.Start("publish-now", store->get(), &cluster, &metrics, /*copy_mode=*/false));
  kvpool_client* client = served.client();
  auto put = [&](int first, int n) { PutValues(client, ids.data(), first, n); };

  put(0, 3);
  EXPECT_EQ(cluster.published(), (std::vector<uint64_t>{3}));  // after the 3, before the answer
  put(0, 3);                                                   // all stored already
  EXPECT_EQ(cluster.published(), (std::vector<uint64_t>{3}));

  // Reserve and commit: published when the commit stored them.
  std::vector<uint64_t> sizes(3, 4096);
  std::vector<kvpool_region> regions(3);
  std::vector<kvpool_status> statuses(3);
  ASSERT_EQ(kvpool_reserve(client, &ids[3], sizes.data(), 3, regions.data(), statuses.data()),
            KVPOOL_OK);
  std::vector<uint64_t> handles;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(statuses[i], KVPOOL_OK);
    auto v = Value(3 + i, 4096);
    std::memcpy(regions[i].data, v.data(), v.size());
    handles.push_back(regions[i].handle);
  }
  EXPECT_EQ(cluster.published(), (std::vector<uint64_t>{3}));
  ASSERT_EQ(kvpool_commit(client, handles.data(), 3, statuses.data()), KVPOOL_OK);
  EXPECT_EQ(cluster.published(), (std::vector<uint64_t>{3, 6}));

  served.Stop();
  pool.Stop();
}

}  // namespace
}  // namespace kvpool
