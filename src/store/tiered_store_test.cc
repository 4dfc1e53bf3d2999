#include "store/tiered_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/executor.h"
#include "store/ssd/fault_device.h"
#include "store/ssd/memory_device.h"
#include "store/ssd/ssd_store.h"

namespace kvpool {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Keys from 1000 on are of another namespace.
KeyId K(int i) { return MakeKeyId(i >= 1000 ? "other" : "tier", std::to_string(i)); }

void Fill(uint8_t* p, int i, uint64_t n) {
  for (uint64_t j = 0; j < n; ++j) p[j] = static_cast<uint8_t>(i * 31 + j * 7);
}
bool Check(const uint8_t* p, int i, uint64_t n) {
  for (uint64_t j = 0; j < n; ++j) {
    if (p[j] != static_cast<uint8_t>(i * 31 + j * 7)) return false;
  }
  return true;
}

class TieredStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(0); }
  // write_latency_us > 0: every SSD write takes that long, one region
  // buffer per directory (demotions soon wait for a write).
  void Open(uint32_t admit_min_reads, uint32_t write_latency_us = 0) {
    tiered_.reset();
    ssd_.reset();
    dram_.reset();
    DramOptions d;
    d.capacity_bytes = 16 * kMiB;
    d.slab_bytes = kMiB;
    d.max_value_bytes = 4 * kMiB;
    d.huge_pages = false;
    auto dr = DramStore::Open(d, &metrics_);
    ASSERT_TRUE(dr.ok()) << dr.status().ToString();
    dram_ = std::move(dr).value();
    SsdOptions s;
    s.dirs = {"/mem/a", "/mem/b"};
    s.capacity_bytes = 128 * kMiB;
    s.region_bytes = 4 * kMiB;
    s.device_factory = disk_.Factory();
    if (write_latency_us > 0) {
      s.device_factory = FaultDevice::Wrap(disk_.Factory(), faults_);
      s.buffers_per_dir = 1;
      s.insert_wait = std::chrono::seconds(5);
    }
    auto sr = SsdStore::Open(s, &metrics_, &flush_pool_);
    ASSERT_TRUE(sr.ok()) << sr.status().ToString();
    ssd_ = std::move(sr).value();
    faults_->SetLatencyMicros(write_latency_us);  // after the start's scan
    TieringOptions t;
    t.admit_min_reads = admit_min_reads;
    tiered_ = std::make_unique<TieredStore>(dram_.get(), ssd_.get(), &pool_, t, &metrics_);
  }
  void TearDown() override {
    pool_.Stop();
    tiered_.reset();
    if (ssd_) (void)ssd_->Close();
    flush_pool_.Stop();
  }
  Status Put(int i, uint64_t n) {
    auto r = tiered_->Reserve(K(i), n);
    if (!r.ok()) return r.status();
    Fill(dram_->segment_base() + r->offset(), i, n);
    return tiered_->Commit(std::move(r).value());
  }
  // Acquires, promoting when needed (waiting), and checks the bytes through a pin.
  Status PromoteAndCheck(int i, uint64_t n) {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status result;
    DramStore::Pin held;
    tiered_->AcquireOrPromote(K(i), [&](Status s, TieredStore::Pin pin) {
      std::lock_guard lock(mu);
      result = s;
      held = std::move(pin);
      done = true;
      cv.notify_all();
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
    if (!result.ok()) return result;
    if (!held.valid() || held.size() != n) return Internal("no pin or wrong size");
    if (!Check(dram_->segment_base() + held.offset(), i, n)) return Corruption("wrong bytes");
    return Status::Ok();
  }

  MetricsRegistry metrics_;
  MemoryDisk disk_;
  std::shared_ptr<FaultInjector> faults_ = std::make_shared<FaultInjector>(1);
  ThreadPool pool_{2, "test-promote"};
  ThreadPool flush_pool_{2, "test-flush"};
  std::unique_ptr<DramStore> dram_;
  std::unique_ptr<SsdStore> ssd_;
  std::unique_ptr<TieredStore> tiered_;
};

TEST_F(TieredStoreTest, EvictedEntriesAreDemotedAndPromotedByteExact) {
  const int kN = 48;  // 48 MiB through a 16 MiB DRAM tier
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(Put(i, kMiB).ok()) << i;
  int in_dram = 0, on_ssd = 0;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(tiered_->Contains(K(i))) << i;
    if (dram_->Contains(K(i))) ++in_dram;
    if (tiered_->Where(K(i)) == HoldingTier::kSsd) ++on_ssd;
  }
  EXPECT_EQ(in_dram + on_ssd, kN);
  EXPECT_GE(on_ssd, 32);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_demotions_total"), dram_->GetStats().evictions);
  // Promoting evicts other entries in turn (already on SSD, so not written
  // again); every key ends up promoted once and byte-exact.
  int promoted = 0;
  for (int i = 0; i < kN; ++i) {
    if (tiered_->Where(K(i)) != HoldingTier::kSsd) continue;
    ASSERT_TRUE(PromoteAndCheck(i, kMiB).ok()) << i;
    EXPECT_TRUE(dram_->Contains(K(i)));
    ++promoted;
  }
  EXPECT_EQ(promoted, kN);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotions_total"), kN);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_demotions_total"), on_ssd + 16);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotion_failures_total"), 0);
}

// The inventory lists every key once: DRAM's, then the SSD tier's but for
// those DRAM listed (a key on both is DRAM's), under the filter, and stops
// when told.
// One read of a batch: the keys DRAM holds are pinned in one hold of its
// lock, the keys only on SSD are cold and promoted (each once, through the
// callback, byte-exact), the others absent; nothing else is pinned.
TEST_F(TieredStoreTest, ReadBatchPinsDramOnceAndPromotesTheColdKeys) {
  const int kN = 24;  // 24 MiB through a 16 MiB DRAM tier: the first ones go to SSD
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(Put(i, kMiB).ok()) << i;
  ASSERT_TRUE(tiered_->Flush().ok());
  std::vector<KeyId> keys;
  std::map<uint32_t, HoldingTier> where;
  for (int i = 0; i < kN; ++i) {
    keys.push_back(K(i));
    auto w = tiered_->Where(K(i));
    ASSERT_TRUE(w.has_value()) << i;
    where[static_cast<uint32_t>(i)] = *w;
  }
  keys.push_back(K(kN));  // never written
  size_t cold_expected = 0;
  for (const auto& [i, w] : where) cold_expected += w == HoldingTier::kSsd;
  ASSERT_GT(cold_expected, 0u);

  // Without a callback: looked up, nothing promoted.
  TieredStore::BatchRead batch;
  const uint64_t rounds = dram_->GetStats().lookup_rounds;
  const double promotions = metrics_.ValueOf("kvpool_tier_promotions_total");
  tiered_->ReadBatch(keys, &batch, nullptr);
  EXPECT_EQ(dram_->GetStats().lookup_rounds - rounds, 1u);
  ASSERT_EQ(batch.pins.size(), keys.size());
  EXPECT_EQ(batch.absent, std::vector<uint32_t>{kN});
  EXPECT_EQ(batch.cold.size(), cold_expected);
  for (uint32_t i : batch.cold) EXPECT_EQ(where[i], HoldingTier::kSsd) << i;
  for (int i = 0; i < kN; ++i) {
    const bool in_dram = where[static_cast<uint32_t>(i)] == HoldingTier::kDram;
    ASSERT_EQ(batch.pins[i].valid(), in_dram) << i;
    if (in_dram) {
      EXPECT_TRUE(Check(batch.pins[i].data(), i, kMiB)) << i;
    }
  }
  EXPECT_FALSE(batch.pins[kN].valid());
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotions_total"), promotions);
  for (auto& p : batch.pins) p.Reset();

  // With one, the cold keys of a batch (and an absent one) are promoted.
  std::vector<KeyId> cold_keys;
  std::vector<uint32_t> cold = batch.cold;
  for (uint32_t i : cold) cold_keys.push_back(keys[i]);
  cold_keys.push_back(K(kN));
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint32_t, TieredStore::Pin> promoted;
  tiered_->ReadBatch(cold_keys, &batch, [&](uint32_t i, TieredStore::Pin pin) {
    std::lock_guard lock(mu);
    promoted.emplace(i, std::move(pin));
    cv.notify_all();
  });
  EXPECT_EQ(batch.absent, std::vector<uint32_t>{static_cast<uint32_t>(cold.size())});
  EXPECT_EQ(batch.cold.size(), cold.size());
  std::unique_lock lock(mu);
  ASSERT_TRUE(
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return promoted.size() == cold.size(); }));
  for (auto& [j, pin] : promoted) {
    const int i = static_cast<int>(cold[j]);
    ASSERT_TRUE(pin.valid()) << i;
    EXPECT_EQ(pin.key(), K(i));
    EXPECT_TRUE(Check(pin.data(), i, kMiB)) << i;
  }
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotions_total"), promotions + cold.size());
}

TEST_F(TieredStoreTest, ListHeldNamesEachKeyOnceFromItsNearestTier) {
  const int kN = 40;  // 40 MiB through a 16 MiB DRAM tier
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(Put(i, kMiB).ok()) << i;
  // Promoted keys are on both tiers.
  int promoted = 0;
  for (int i = 0; i < kN && promoted < 3; ++i) {
    if (tiered_->Where(K(i)) != HoldingTier::kSsd) continue;
    ASSERT_TRUE(PromoteAndCheck(i, kMiB).ok()) << i;
    ++promoted;
  }
  ASSERT_EQ(promoted, 3);
  std::map<KeyId, HoldingTier> want;
  for (int i = 0; i < kN; ++i) {
    want[K(i)] = dram_->Contains(K(i)) ? HoldingTier::kDram : HoldingTier::kSsd;
  }
  std::map<KeyId, HoldingTier> got;
  uint64_t calls = 0;
  const uint64_t n = tiered_->ListHeld(nullptr, [&](const KeyId& k, uint64_t size, HoldingTier t) {
    ++calls;
    EXPECT_EQ(size, kMiB);
    EXPECT_TRUE(got.emplace(k, t).second) << "listed twice";
    return true;
  });
  EXPECT_EQ(n, static_cast<uint64_t>(kN));
  EXPECT_EQ(calls, static_cast<uint64_t>(kN));
  EXPECT_EQ(got, want);
  // The filter: keys whose high half is even.
  got.clear();
  tiered_->ListHeld([](uint64_t hi) { return hi % 2 == 0; },
                    [&](const KeyId& k, uint64_t, HoldingTier t) {
                      got.emplace(k, t);
                      return true;
                    });
  std::map<KeyId, HoldingTier> even;
  for (const auto& [k, t] : want) {
    if (k.hi % 2 == 0) even.emplace(k, t);
  }
  EXPECT_EQ(got, even);
  // Stopped at the third key: three calls, whichever tier it was in.
  calls = 0;
  EXPECT_EQ(
      tiered_->ListHeld(nullptr, [&](const KeyId&, uint64_t, HoldingTier) { return ++calls < 3; }),
      3u);
  EXPECT_EQ(calls, 3u);
}

TEST_F(TieredStoreTest, KeysOnEitherTierAreImmutable) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  int cold = -1;
  for (int i = 0; i < 40 && cold < 0; ++i) {
    if (tiered_->Where(K(i)) == HoldingTier::kSsd) cold = i;
  }
  ASSERT_GE(cold, 0);
  EXPECT_EQ(tiered_->Reserve(K(cold), kMiB).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(tiered_->Reserve(K(39), kMiB).status().code(), StatusCode::kAlreadyExists);
}

TEST_F(TieredStoreTest, ConcurrentPromotionsOfOneKeyShareOneRead) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  ASSERT_TRUE(tiered_->Where(K(0)) == HoldingTier::kSsd);
  const double bytes_before = metrics_.ValueOf("kvpool_ssd_read_bytes_total");
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&] {
      if (PromoteAndCheck(0, kMiB).ok()) ++ok;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 8);
  // One device read, whatever the interleaving: later callers either joined
  // the read in flight or found the key in DRAM already.
  EXPECT_EQ(metrics_.ValueOf("kvpool_ssd_read_bytes_total") - bytes_before, kMiB);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotions_total"), 1);
}

// Prefetches a batch and waits for its answer.
Result<HintResult> PrefetchAndWait(TieredStore* tiered, const std::vector<KeyId>& keys) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<HintResult>> answer;
  tiered->Prefetch(keys, [&](Result<HintResult> r) {
    std::lock_guard lock(mu);
    answer = std::move(r);
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return answer.has_value(); });
  return std::move(*answer);
}

class CountHoldings final : public HoldingsObserver {
 public:
  void OnHoldings(const HoldingsEvent& e) override {
    std::lock_guard lock(mu);
    if (e.kind == HoldingsEvent::Kind::kDropped && e.why == HoldingsEvent::Why::kMovedToSsd &&
        e.still_held) {
      ++moved_to_ssd;
    }
  }
  std::mutex mu;
  int moved_to_ssd = 0;
};

// Demote writes each DRAM entry to SSD now and drops it from DRAM, told as
// moved to SSD (still held); its next read promotes it byte-exact.
TEST_F(TieredStoreTest, DemoteMovesEntriesToSsdStillHeld) {
  CountHoldings seen;
  tiered_->SetHoldingsObserver(&seen);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  std::vector<KeyId> keys = {K(1), K(3), K(5), K(500)};
  auto r = tiered_->Demote(keys);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->applied, 3u);
  EXPECT_EQ(r->moved, 3u);
  EXPECT_EQ(r->unknown, 1u);
  for (int i : {1, 3, 5}) {
    EXPECT_FALSE(dram_->Contains(K(i))) << i;
    EXPECT_TRUE(tiered_->Where(K(i)) == HoldingTier::kSsd) << i;
  }
  EXPECT_TRUE(dram_->Contains(K(2)));
  EXPECT_EQ(dram_->GetStats().entries, 5u);
  EXPECT_EQ(dram_->GetStats().evictions, 0u);  // moved, not evicted
  {
    std::lock_guard lock(seen.mu);
    EXPECT_EQ(seen.moved_to_ssd, 3);
  }
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(PromoteAndCheck(i, kMiB).ok()) << i;
  tiered_->SetHoldingsObserver(nullptr);
}

// Prefetch brings SSD-held keys into DRAM: the answer counts them, and the
// next read of each is a DRAM hit counted as a prefetch hit, byte-exact.
TEST_F(TieredStoreTest, PrefetchBringsSsdKeysIntoDram) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  std::vector<KeyId> keys;
  int cold = 0;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(K(i));
    if (tiered_->Where(K(i)) == HoldingTier::kSsd) ++cold;
  }
  ASSERT_EQ(cold, 4);
  keys.push_back(K(39));   // in DRAM already
  keys.push_back(K(777));  // in neither tier
  auto r = PrefetchAndWait(tiered_.get(), keys);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->applied, 5u);
  EXPECT_EQ(r->moved, 4u);
  EXPECT_EQ(r->unknown, 1u);
  EXPECT_EQ(dram_->GetStats().prefetched_entries, 4u);
  const double misses = metrics_.ValueOf("kvpool_dram_misses_total");
  for (int i = 0; i < 4; ++i) {
    auto pin = tiered_->Acquire(K(i));  // a DRAM hit: no promotion
    ASSERT_TRUE(pin.ok()) << i;
    EXPECT_TRUE(Check(pin->data(), i, kMiB)) << i;
  }
  EXPECT_EQ(metrics_.ValueOf("kvpool_dram_misses_total"), misses);
  EXPECT_EQ(dram_->GetStats().prefetch_hits, 4u);
  EXPECT_EQ(dram_->GetStats().prefetched_entries, 0u);
  // Too many keys: refused at once, nothing starts.
  std::vector<KeyId> many(8193, K(0));
  EXPECT_EQ(PrefetchAndWait(tiered_.get(), many).status().code(), StatusCode::kInvalidArgument);
}

// Prefetches racing reads and demotions of the same keys: every read
// returns the exact bytes, and every key stays held.
TEST_F(TieredStoreTest, PrefetchRacingReadsAndDemotesIsByteExact) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread hinter([&] {
    std::vector<KeyId> keys;
    for (int i = 0; i < 40; i += 3) keys.push_back(K(i));
    for (int round = 0; round < 20; ++round) {
      if (!PrefetchAndWait(tiered_.get(), keys).ok()) ++bad;
      if (!tiered_->Demote(keys).ok()) ++bad;
    }
    stop = true;
  });
  int reads = 0;
  while (!stop.load() || reads < 200) {
    const int i = reads++ % 40;
    Status s = PromoteAndCheck(i, kMiB);
    if (!s.ok()) {
      ADD_FAILURE() << i << ": " << s.ToString();
      ++bad;
    }
  }
  hinter.join();
  EXPECT_EQ(bad.load(), 0);
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(tiered_->Contains(K(i))) << i;
}

TEST_F(TieredStoreTest, RemoveDropsBothTiers) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  ASSERT_TRUE(tiered_->Where(K(0)) == HoldingTier::kSsd);
  EXPECT_TRUE(tiered_->Remove(K(0)).ok());
  EXPECT_TRUE(tiered_->Remove(K(39)).ok());
  EXPECT_FALSE(tiered_->Contains(K(0)));
  EXPECT_FALSE(tiered_->Contains(K(39)));
  EXPECT_EQ(tiered_->Remove(K(0)).code(), StatusCode::kNotFound);
  EXPECT_EQ(PromoteAndCheck(0, kMiB).code(), StatusCode::kNotFound);
}

TEST_F(TieredStoreTest, ClearNamespaceDropsItsKeysFromBothTiersAndNoOthers) {
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Put(i, kMiB).ok());
    ASSERT_TRUE(Put(1000 + i, kMiB).ok());
  }
  ASSERT_TRUE(tiered_->Flush().ok());
  int tier_on_ssd = 0;
  for (int i = 0; i < 20; ++i) tier_on_ssd += tiered_->Where(K(i)) == HoldingTier::kSsd ? 1 : 0;
  ASSERT_GT(tier_on_ssd, 0);  // the clear reaches SSD-only entries
  ASSERT_LT(tier_on_ssd, 20);  // and DRAM ones
  EXPECT_EQ(tiered_->ClearNamespace(NamespaceTag("tier")), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(tiered_->Contains(K(i))) << i;
    EXPECT_EQ(PromoteAndCheck(i, kMiB).code(), StatusCode::kNotFound) << i;
  }
  for (int i = 1000; i < 1020; ++i) EXPECT_TRUE(PromoteAndCheck(i, kMiB).ok()) << i;
  EXPECT_EQ(tiered_->ClearNamespace(NamespaceTag("tier")), 0u);
  EXPECT_EQ(tiered_->ClearNamespace(NamespaceTag("other")), 20u);
  EXPECT_EQ(dram_->GetStats().entries, 0u);
  EXPECT_EQ(ssd_->GetStats().entries, 0u);
}

TEST_F(TieredStoreTest, AdmissionSkipsEntriesReadTooRarely) {
  Open(/*admit_min_reads=*/2);
  // Keys 0..7 are read three times while cached; the rest never.
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(Put(i, kMiB).ok());
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(tiered_->Acquire(K(i)).ok());
  }
  // Many entries read once each: they reach S3-FIFO's main queue too and
  // push the hot ones out of DRAM eventually.
  const int kN = 200;
  for (int i = 8; i < kN; ++i) {
    ASSERT_TRUE(Put(i, kMiB).ok());
    ASSERT_TRUE(tiered_->Acquire(K(i)).ok());
  }
  int hot_evicted = 0, hot_on_ssd = 0, cold_on_ssd = 0;
  for (int i = 0; i < kN; ++i) {
    if (dram_->Contains(K(i))) continue;
    bool on_ssd = tiered_->Contains(K(i));
    if (i < 8) {
      ++hot_evicted;
      hot_on_ssd += on_ssd;
    } else {
      cold_on_ssd += on_ssd;
    }
  }
  ASSERT_GT(hot_evicted, 0);           // else the test proves nothing
  EXPECT_EQ(hot_on_ssd, hot_evicted);  // every evicted hot entry went to SSD
  EXPECT_EQ(cold_on_ssd, 0);           // no one-time entry did
  EXPECT_GT(metrics_.ValueOf("kvpool_tier_demotions_skipped_total"), 0);
}

// A put that must wait for the SSD tier (every buffer being written) waits
// before it takes the DRAM lock: other requests are served meanwhile, and
// no demotion is dropped.
TEST_F(TieredStoreTest, PutWaitingForSsdRoomDoesNotBlockDram) {
  Open(0, /*write_latency_us=*/500'000);
  constexpr int kN = 40;  // 16 fit in DRAM; 24 demotions = 8+ region writes
  std::atomic<bool> writing{true};
  Status put_status;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread writer([&] {
    for (int i = 0; i < kN && put_status.ok(); ++i) put_status = Put(i, kMiB);
    writing = false;
  });
  double worst_s = 0;
  uint64_t calls = 0;
  for (int i = 0; writing; ++i, ++calls) {
    const auto c0 = std::chrono::steady_clock::now();
    (void)tiered_->Contains(K(i % kN));  // takes the DRAM lock
    worst_s = std::max(
        worst_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    std::this_thread::yield();
  }
  writer.join();
  const double put_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(put_status.ok()) << put_status.ToString();
  EXPECT_GT(put_s, 1.0);    // the puts did wait for writes (else this proves nothing)
  EXPECT_GT(calls, 100u);
  EXPECT_LT(worst_s, 0.25);  // a write takes 0.5 s; no lookup waited for one
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_demotions_dropped_total"), 0);
  EXPECT_GE(dram_->GetStats().evictions, kN - 16u);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_demotions_total"), dram_->GetStats().evictions);
  faults_->SetLatencyMicros(0);
  ASSERT_TRUE(tiered_->Flush().ok());
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(PromoteAndCheck(i, kMiB).ok()) << i;
}

// A DRAM hit and a miss in both tiers are answered inside the call, with a
// move-only callback that is never copied; the bytes come through the pin.
TEST_F(TieredStoreTest, AcquireOrPromoteAnswersDramHitsAndMissesInline) {
  ASSERT_TRUE(Put(1, kMiB).ok());
  ASSERT_TRUE(tiered_->Where(K(1)) == HoldingTier::kDram);
  const double promotions = metrics_.ValueOf("kvpool_tier_promotions_total");
  int calls = 0;
  Status got;
  TieredStore::Pin held;
  auto token = std::make_unique<int>(7);  // makes the callback move-only
  tiered_->AcquireOrPromote(K(1), [&, token = std::move(token)](Status s, TieredStore::Pin p) {
    ++calls;
    got = s;
    held = std::move(p);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(got.ok());
  ASSERT_TRUE(held.valid());
  EXPECT_EQ(held.size(), kMiB);
  EXPECT_EQ(held.bytes().size(), kMiB);
  EXPECT_TRUE(Check(held.data(), 1, kMiB));

  calls = 0;
  tiered_->AcquireOrPromote(K(999), [&](Status s, TieredStore::Pin p) {
    ++calls;
    got = s;
    held = std::move(p);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.code(), StatusCode::kNotFound);
  EXPECT_FALSE(held.valid());
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotions_total"), promotions);
}

// An entry only on SSD is promoted for a move-only callback too.
TEST_F(TieredStoreTest, AcquireOrPromoteKeepsMoveOnlyCallbackForPromotion) {
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Put(i, kMiB).ok());
  ASSERT_TRUE(tiered_->Where(K(0)) == HoldingTier::kSsd);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool bytes_ok = false;
  auto token = std::make_unique<int>(7);
  tiered_->AcquireOrPromote(K(0), [&, token = std::move(token)](Status s, TieredStore::Pin p) {
    std::lock_guard lock(mu);
    bytes_ok = s.ok() && p.valid() && *token == 7 && Check(p.data(), 0, kMiB);
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  EXPECT_TRUE(bytes_ok);
  EXPECT_EQ(metrics_.ValueOf("kvpool_tier_promotions_total"), 1);
}

// A store made by Open owns its tiers; a reservation's bytes are written
// through data() and read back through a pin.
TEST(TieredStoreOpenTest, OwnsDramOnlyTier) {
  MetricsRegistry metrics;
  ThreadPool pool{1, "test-open"};
  DramOptions d;
  d.capacity_bytes = 16 * kMiB;
  d.slab_bytes = kMiB;
  d.max_value_bytes = 4 * kMiB;
  d.huge_pages = false;
  auto opened = TieredStore::Open(d, nullptr, &pool, &pool, TieringOptions{}, &metrics);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<TieredStore> store = std::move(opened).value();
  EXPECT_FALSE(store->has_ssd_tier());
  EXPECT_EQ(store->segment().size(), store->segment_bytes());
  EXPECT_EQ(store->max_value_bytes(), 4 * kMiB);
  auto r = store->Reserve(K(3), 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data(), store->segment().data() + r->offset());
  EXPECT_EQ(r->bytes().size(), 1000u);
  Fill(r->data(), 3, 1000);
  ASSERT_TRUE(store->Commit(std::move(r).value()).ok());
  {
    auto pin = store->Acquire(K(3));
    ASSERT_TRUE(pin.ok());
    EXPECT_TRUE(Check(pin->data(), 3, 1000));
  }
  std::vector<KeyId> listed;
  EXPECT_EQ(store->ListHeld(nullptr,
                            [&](const KeyId& k, uint64_t size, HoldingTier tier) {
                              EXPECT_EQ(size, 1000u);
                              EXPECT_EQ(tier, HoldingTier::kDram);
                              listed.push_back(k);
                              return true;
                            }),
            1u);
  EXPECT_EQ(listed, std::vector<KeyId>{K(3)});
  EXPECT_EQ(store->GetDramStats().entries, 1u);
  EXPECT_TRUE(store->Close().ok());
  EXPECT_TRUE(store->Flush().ok());
  pool.Stop();
}

// Runs what is submitted only when told: the SSD tier's copies and region
// writes wait for the test.
class HeldExecutor final : public Executor {
 public:
  void Submit(std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(fn));
  }
  void RunAll() {
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard lock(mu_);
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.erase(queue_.begin());
      }
      fn();
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;
};

// The tiers of the lending tests: 8 MiB of DRAM with a 4 MiB read room
// (demotions in place borrow from it), over an in-memory SSD tier whose
// background work runs on `flushes`.
struct LendTiers {
  void Open(Executor* flushes, uint64_t ssd_bytes, uint64_t region_bytes) {
    DramOptions d;
    d.capacity_bytes = 8 * kMiB;
    d.read_room_bytes = 4 * kMiB;
    d.slab_bytes = kMiB;
    d.max_value_bytes = kMiB;
    d.huge_pages = false;
    auto dr = DramStore::Open(d, &metrics);
    ASSERT_TRUE(dr.ok());
    dram = std::move(dr).value();
    SsdOptions so;
    so.dirs = {"/mem/a"};
    so.capacity_bytes = ssd_bytes;
    so.region_bytes = region_bytes;
    so.device_factory = disk.Factory();
    so.insert_wait = std::chrono::seconds(5);
    auto sr = SsdStore::Open(so, &metrics, flushes);
    ASSERT_TRUE(sr.ok());
    ssd = std::move(sr).value();
    tiered =
        std::make_unique<TieredStore>(dram.get(), ssd.get(), &promote, TieringOptions{}, &metrics);
  }
  // Key i's value, read from DRAM or else from the SSD tier (which reads a
  // lent value from its slot), against what was put.
  enum class Read { kExact, kWrong, kMissing };
  Read ReadBack(int i, uint64_t n) {
    auto pin = tiered->Acquire(K(i));
    if (pin.ok()) return Check(pin->data(), i, n) ? Read::kExact : Read::kWrong;
    std::vector<uint8_t> got(n);
    if (!ssd->Read(K(i), got.data(), n).ok()) return Read::kMissing;
    return Check(got.data(), i, n) ? Read::kExact : Read::kWrong;
  }
  MetricsRegistry metrics;
  MemoryDisk disk;
  ThreadPool promote{1, "test-promote"};
  std::unique_ptr<DramStore> dram;
  std::unique_ptr<SsdStore> ssd;
  std::unique_ptr<TieredStore> tiered;
};

// A demotion in place keeps the evicted slot: later puts never get it while
// the SSD tier reads and writes from it, and every key reads back exact
// from wherever it is, before and after the SSD tier lets the slots go.
TEST(TieredStoreLendTest, ALentSlotIsNotReusedUntilTheSsdTierLetsItGo) {
  HeldExecutor flushes;
  LendTiers t;
  ASSERT_NO_FATAL_FAILURE(t.Open(&flushes, 64 * kMiB, 4 * kMiB));
  auto& dram = t.dram;
  auto& ssd = t.ssd;
  auto& tiered = t.tiered;
  const uint64_t n = 200000;
  const int keys = 48;
  std::vector<uint8_t> v(n);
  for (int i = 0; i < keys; ++i) {
    Fill(v.data(), i, n);
    ASSERT_TRUE(tiered->Put(K(i), v, {}).ok()) << i;
  }
  // Every key, byte-exact, from wherever it is.
  auto check_all = [&] {
    for (int i = 0; i < keys; ++i) ASSERT_EQ(t.ReadBack(i, n), LendTiers::Read::kExact) << i;
  };
  const uint64_t lent = dram->GetStats().lent;
  EXPECT_GT(lent, 0u);
  // At most half the read room is lent at once.
  EXPECT_GT(ssd->GetStats().lent_bytes, 0u);
  EXPECT_LE(ssd->GetStats().lent_bytes, 2 * kMiB);
  EXPECT_EQ(dram->GetStats().pinned, ssd->GetStats().lent_bytes / n);
  check_all();
  flushes.RunAll();  // the copies, then the region writes
  ASSERT_TRUE(ssd->Flush().ok());
  EXPECT_EQ(ssd->GetStats().lent_bytes, 0u);
  EXPECT_EQ(dram->GetStats().pinned, 0u);
  check_all();
  // The slots given back are used again: more puts, all exact.
  for (int i = keys; i < keys + 16; ++i) {
    Fill(v.data(), i, n);
    ASSERT_TRUE(tiered->Put(K(i), v, {}).ok()) << i;
  }
  check_all();
  t.promote.Stop();
  tiered.reset();
  flushes.RunAll();
  ASSERT_TRUE(ssd->Close().ok());
}

// Demotions in place with the copies and region writes on their threads,
// puts and reads racing them: every read is exact.
TEST(TieredStoreLendTest, ConcurrentPutsAndReadsWhileSlotsAreLentAreExact) {
  ThreadPool flushes(2, "test-flush");
  LendTiers t;
  ASSERT_NO_FATAL_FAILURE(t.Open(&flushes, 256 * kMiB, 2 * kMiB));
  auto& dram = t.dram;
  auto& ssd = t.ssd;
  auto& tiered = t.tiered;
  const uint64_t n = 100000;
  const int per_writer = 400;
  std::atomic<int> written{0}, wrong{0}, misses{0};
  auto read_check = [&](int i) {
    const LendTiers::Read r = t.ReadBack(i, n);
    if (r == LendTiers::Read::kWrong) ++wrong;
    if (r == LendTiers::Read::kMissing) ++misses;  // a demotion dropped, or mid-promotion
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      std::vector<uint8_t> v(n);
      for (int k = 0; k < per_writer; ++k) {
        const int i = w * per_writer + k;
        Fill(v.data(), i, n);
        if (tiered->Put(K(i), v, {}).ok()) ++written;
      }
    });
  }
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    uint64_t x = 1;
    while (!stop) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      read_check(static_cast<int>((x >> 33) % (2 * per_writer)));
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  reader.join();
  EXPECT_EQ(written, 2 * per_writer);
  EXPECT_GT(dram->GetStats().lent, 0u);
  ASSERT_TRUE(ssd->Flush().ok());
  EXPECT_EQ(ssd->GetStats().lent_bytes, 0u);
  for (int i = 0; i < 2 * per_writer; ++i) read_check(i);
  EXPECT_EQ(wrong, 0);
  t.promote.Stop();
  tiered.reset();
  flushes.Stop();
  ASSERT_TRUE(ssd->Close().ok());
}

// Gather writes from the slots only where the segment is on 2 MiB pages
// (hugetlb, or transparent ones under 9/10 of it at least), for at most
// half of what may be lent: half the read room.
TEST(TieredStoreLendTest, SlotsAreGatheredOnlyFromHugePagesForHalfTheLendBudget) {
  constexpr uint64_t kSegment = 1088ull << 20;
  DramStats ds;
  ds.read_room_bytes = 64ull << 20;
  EXPECT_FALSE(LendTermsFor(ds, kSegment).gather);  // 4 KiB pages
  EXPECT_EQ(LendTermsFor(ds, kSegment).max_lent_bytes, 32ull << 20);
  EXPECT_EQ(LendTermsFor(ds, kSegment).max_gathered_bytes, 16ull << 20);
  ds.huge_page_bytes = kSegment;  // transparent huge pages, all of it
  EXPECT_TRUE(LendTermsFor(ds, kSegment).gather);
  ds.huge_page_bytes = kSegment / 10 * 9;
  EXPECT_TRUE(LendTermsFor(ds, kSegment).gather);
  ds.huge_page_bytes = kSegment / 10 * 9 - (2ull << 20);
  EXPECT_FALSE(LendTermsFor(ds, kSegment).gather);
  ds.huge_page_bytes = 0;
  ds.huge_pages = true;  // hugetlb pages
  EXPECT_TRUE(LendTermsFor(ds, kSegment).gather);
  ds.read_room_bytes = 0;  // no read room: nothing is lent
  EXPECT_EQ(LendTermsFor(ds, kSegment).max_lent_bytes, 0u);
  EXPECT_EQ(LendTermsFor(ds, kSegment).max_gathered_bytes, 0u);
}

}  // namespace
}  // namespace kvpool
