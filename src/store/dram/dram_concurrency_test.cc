// Several threads reserve, commit, acquire and verify bytes at once.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "store/dram/dram_store.h"
#include "store/dram/dram_test_util.h"

namespace kvpool::dram {
namespace {

using testing::CheckPattern;
using testing::Key;
using testing::Put;
using testing::SmallOptions;

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// Each key has one size, so concurrent writers of a key write the same bytes.
uint64_t SizeOf(uint64_t k) {
  static constexpr uint64_t kSizes[] = {512, 8 * KiB, 64 * KiB, 200 * KiB, 1 * MiB, 2 * MiB + 1};
  return kSizes[testing::SplitMix(k) % std::size(kSizes)];
}

TEST(DramConcurrencyTest, ThreadsPutGetVerify) {
  auto store = std::move(DramStore::Open(SmallOptions(64 * MiB, 1 * MiB), nullptr)).value();
  constexpr int kThreads = 4;
  constexpr uint64_t kKeys = 200;  // ~110 MiB of values for a 64 MiB store
  std::atomic<uint64_t> hits{0}, commits{0}, lost_races{0}, bad{0}, exhausted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<DramStore::Pin> held;
      for (int op = 0; op < 6000; ++op) {
        const uint64_t k = rng() % kKeys;
        if (rng() % 2 == 0) {
          auto r = store->Reserve(Key(k), SizeOf(k));
          if (!r.ok()) {
            if (r.status().code() == StatusCode::kResourceExhausted) ++exhausted;
            continue;
          }
          testing::FillPattern(Key(k), store->segment_base() + r->offset(), SizeOf(k));
          Status st = store->Commit(std::move(r).value());
          if (st.ok()) ++commits;
          else if (st.code() == StatusCode::kAlreadyExists) ++lost_races;
          else ++bad;
        } else {
          auto pin = store->Acquire(Key(k));
          if (!pin.ok()) continue;
          ++hits;
          if (pin->size() != SizeOf(k) ||
              !CheckPattern(Key(k), store->segment_base() + pin->offset(), pin->size())) {
            ++bad;
          }
          if (rng() % 4 == 0) held.push_back(std::move(pin).value());
          if (held.size() > 2) held.erase(held.begin());
          if (rng() % 16 == 0) (void)store->Remove(Key(rng() % kKeys));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_EQ(exhausted.load(), 0u);
  std::printf("hits %llu commits %llu lost races %llu\n", (unsigned long long)hits.load(),
              (unsigned long long)commits.load(), (unsigned long long)lost_races.load());
  EXPECT_GT(hits.load(), 2000u);
  EXPECT_GT(commits.load(), 1000u);
  const DramStats s = store->GetStats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.pinned, 0u);
  uint64_t entries = 0, used = 0;
  for (uint64_t k = 0; k < kKeys; ++k) {
    if (!store->Contains(Key(k))) continue;
    ++entries;
    used += SizeOf(k);
    auto pin = store->Acquire(Key(k));
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(CheckPattern(Key(k), store->segment_base() + pin->offset(), SizeOf(k)));
  }
  EXPECT_EQ(s.entries, entries);
  EXPECT_EQ(s.used_bytes, used);
}

}  // namespace
}  // namespace kvpool::dram
