// Hot-path latencies of DramStore, uncontended (Google Benchmark).
#include <benchmark/benchmark.h>

#include "store/dram/dram_store.h"
#include "store/dram/dram_test_util.h"

namespace kvpool::dram {
namespace {

using testing::Key;

constexpr uint64_t kEntries = 16384;  // 1 GiB of 64 KiB values

std::unique_ptr<DramStore> Filled() {
  DramOptions o;
  o.prefault = false;  // metadata only
  o.huge_pages = false;
  auto store = std::move(DramStore::Open(o, nullptr)).value();
  for (uint64_t i = 0; i < kEntries; ++i) {
    auto r = store->Reserve(Key(i), 64 << 10);
    KVPOOL_CHECK(r.ok() && store->Commit(std::move(r).value()).ok());
  }
  return store;
}

void BM_ContainsHit(benchmark::State& state) {
  auto store = Filled();
  uint64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(store->Contains(Key(i++ % kEntries)));
}
BENCHMARK(BM_ContainsHit);

void BM_ContainsMiss(benchmark::State& state) {
  auto store = Filled();
  uint64_t i = kEntries;
  for (auto _ : state) benchmark::DoNotOptimize(store->Contains(Key(i++)));
}
BENCHMARK(BM_ContainsMiss);

void BM_AcquireUnpin(benchmark::State& state) {
  auto store = Filled();
  uint64_t i = 0;
  for (auto _ : state) {
    auto pin = store->Acquire(Key(i++ % kEntries));
    benchmark::DoNotOptimize(pin->offset());
  }
}
BENCHMARK(BM_AcquireUnpin);

void BM_AcquireMiss(benchmark::State& state) {
  auto store = Filled();
  uint64_t i = kEntries;
  for (auto _ : state) benchmark::DoNotOptimize(store->Acquire(Key(i++)).ok());
}
BENCHMARK(BM_AcquireMiss);

// A full store: every put evicts.
void BM_ReserveCommitEvicting(benchmark::State& state) {
  auto store = Filled();
  uint64_t i = kEntries;
  for (auto _ : state) {
    auto r = store->Reserve(Key(i++), 64 << 10);
    benchmark::DoNotOptimize(store->Commit(std::move(r).value()).ok());
  }
}
BENCHMARK(BM_ReserveCommitEvicting);

}  // namespace
}  // namespace kvpool::dram

BENCHMARK_MAIN();
