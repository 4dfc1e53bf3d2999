#include "store/dram/dram_store.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "store/dram/dram_test_util.h"
#include "store/dram/segment.h"

namespace kvpool::dram {
namespace {

using testing::CheckPattern;
using testing::FillPattern;
using testing::Get;
using testing::Key;
using testing::Put;
using testing::SmallOptions;
using testing::SplitMix;

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

std::unique_ptr<DramStore> OpenStore(const DramOptions& o, MetricsRegistry* m = nullptr) {
  auto s = DramStore::Open(o, m);
  KVPOOL_CHECK(s.ok());
  return std::move(s).value();
}

const DramClassStats* ClassOf(const DramStats& s, uint64_t slot_bytes) {
  for (const auto& c : s.classes) {
    if (c.slot_bytes == slot_bytes) return &c;
  }
  return nullptr;
}

TEST(DramStoreTest, ValidatesOptions) {
  DramOptions o = SmallOptions();
  EXPECT_TRUE(o.Validate().ok());
  o.capacity_bytes = 16 * MiB + 4096;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = SmallOptions();
  o.eviction = "fifo";
  EXPECT_EQ(DramStore::Open(o, nullptr).status().code(), StatusCode::kInvalidArgument);
  o = SmallOptions();
  o.class_growth = 1.0;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = SmallOptions(1ull << 40, 4 * MiB);  // 2^18 slabs x 2^16 slots of 64 B: ids overflow
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.min_class_bytes = 4096;
  o.max_value_bytes = 64 * MiB;
  EXPECT_TRUE(o.Validate().ok());
  o.max_value_bytes = 4ull << 30;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = SmallOptions();
  o.read_room_bytes = 16 * MiB;
  EXPECT_TRUE(o.Validate().ok());
  o.read_room_bytes = MiB + 4096;  // not whole slabs
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.read_room_bytes = 17 * MiB;  // more than the capacity
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(DramStoreTest, PutGetThroughSegmentAndClientMapping) {
  MetricsRegistry metrics;
  DramOptions o = SmallOptions();
  o.huge_pages = true;  // no hugetlb pages here: must fall back, not fail
  auto store = OpenStore(o, &metrics);
  EXPECT_EQ(store->segment_bytes(), 16 * MiB);
  EXPECT_EQ(store->max_value_bytes(), 16 * MiB);

  // A client maps the fd itself and writes through its own mapping.
  void* client = mmap(nullptr, store->segment_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                      store->segment_fd(), 0);
  ASSERT_NE(client, MAP_FAILED);
  auto r = store->Reserve(Key(1), 100 * KiB);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->offset() % 64, 0u);
  FillPattern(Key(1), static_cast<uint8_t*>(client) + r->offset(), 100 * KiB);
  EXPECT_FALSE(store->Contains(Key(1)));  // reserved is invisible
  EXPECT_EQ(store->Acquire(Key(1)).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(store->Commit(std::move(r).value()).ok());
  EXPECT_TRUE(store->Contains(Key(1)));
  EXPECT_TRUE(Get(*store, Key(1), 100 * KiB).ok());
  munmap(client, store->segment_bytes());

  ASSERT_TRUE(Put(*store, Key(2), 1).ok());
  ASSERT_TRUE(Put(*store, Key(3), 1 * MiB).ok());
  EXPECT_TRUE(Get(*store, Key(2), 1).ok());
  EXPECT_TRUE(Get(*store, Key(3), 1 * MiB).ok());
  const DramStats s = store->GetStats();
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.used_bytes, 100 * KiB + 1 + MiB);
  // 100 KiB lands in the 9-per-slab class (1 MiB / 9, rounded down to 64).
  ASSERT_NE(ClassOf(s, (MiB / 9) & ~uint64_t{63}), nullptr);
  EXPECT_EQ(ClassOf(s, (MiB / 9) & ~uint64_t{63})->entries, 1u);
  EXPECT_EQ(s.allocated_bytes, ((MiB / 9) & ~uint64_t{63}) + 64 + MiB);
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.pinned, 0u);
  EXPECT_FALSE(s.huge_pages);
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_entries"), 3);
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_used_bytes"), static_cast<double>(s.used_bytes));
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_capacity_bytes"), 16.0 * MiB);
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_hits_total"), 3);
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_misses_total"), 1);
  EXPECT_EQ(metrics.ValueOf("kvpool_dram_index_bytes"), static_cast<double>(s.index_bytes));
}

TEST(SegmentTest, PmdMappedBytesAreTheMappingsOwn) {
  const std::string smaps =
      "7f0000000000-7f0000400000 rw-s 00000000 00:01 1 /memfd:other (deleted)\n"
      "Size:               4096 kB\n"
      "ShmemPmdMapped:     4096 kB\n"
      "7f9d82400000-7f9dc6400000 rw-s 00000000 00:01 95511 /memfd:kvpool-dram (deleted)\n"
      "Size:            1114112 kB\n"
      "AnonHugePages:         0 kB\n"
      "ShmemPmdMapped:   1048576 kB\n"
      "FilePmdMapped:       2048 kB\n"
      "Shared_Hugetlb:        0 kB\n"
      "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n"
      "ShmemPmdMapped:        8 kB\n";
  EXPECT_EQ(PmdMappedBytes(smaps, 0x7f9d82400000), (1048576ull + 2048) << 10);
  EXPECT_EQ(PmdMappedBytes(smaps, 0x7f0000000000), 4096ull << 10);
  EXPECT_EQ(PmdMappedBytes(smaps, 0x7f9d82401000), 0u);  // no mapping starts there
  EXPECT_EQ(PmdMappedBytes("", 0x7f9d82400000), 0u);
}

TEST(SegmentTest, SelectedThpSettingIsTheBracketedOne) {
  EXPECT_EQ(SelectedThpSetting("always within_size advise [never] deny force\n"), "never");
  EXPECT_EQ(SelectedThpSetting("always [advise] never\n"), "advise");
  EXPECT_EQ(SelectedThpSetting(""), "");
  EXPECT_EQ(SelectedThpSetting("always advise never"), "");
}

// What the segment reports follows the host's setting for transparent
// huge pages of shared memory (this test only reads it): none where it is
// off, some where the kernel may use them.
TEST(SegmentTest, HugePageBytesFollowTheHostsSetting) {
  SegmentOptions o;
  o.bytes = 8 * MiB;
  o.huge_pages = true;  // no hugetlb pages reserved here: transparent ones, where allowed
  auto seg = Segment::Create(o);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  if ((*seg)->huge_pages()) {
    EXPECT_EQ((*seg)->huge_page_bytes(), o.bytes);
    return;
  }
  std::ifstream in(kShmemThpFile);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string thp = SelectedThpSetting(text);
  if (thp.empty() || thp == "never" || thp == "deny") {
    EXPECT_EQ((*seg)->huge_page_bytes(), 0u) << "shmem_enabled: " << thp;
  } else {
    EXPECT_GT((*seg)->huge_page_bytes(), 0u) << "shmem_enabled: " << thp;
    EXPECT_LE((*seg)->huge_page_bytes(), o.bytes);
  }
  SegmentOptions small = o;
  small.huge_pages = false;  // no MADV_HUGEPAGE: advise gives it none
  auto plain = Segment::Create(small);
  ASSERT_TRUE(plain.ok());
  if (thp != "always" && thp != "force") {
    EXPECT_EQ((*plain)->huge_page_bytes(), 0u);
  }
}

TEST(DramStoreTest, RejectsBadSizesAndCommittedKeys) {
  auto store = OpenStore(SmallOptions());
  EXPECT_EQ(store->Reserve(Key(1), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Reserve(Key(1), 16 * MiB + 1).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(Put(*store, Key(1), 4096).ok());
  EXPECT_EQ(store->Reserve(Key(1), 4096).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Reserve(Key(1), 8192).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Commit(DramStore::Reservation()).code(), StatusCode::kInvalidArgument);
}

TEST(DramStoreTest, FirstCommitWins) {
  auto store = OpenStore(SmallOptions());
  auto first = store->Reserve(Key(7), 64 * KiB);
  auto second = store->Reserve(Key(7), 32 * KiB);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->offset(), second->offset());
  EXPECT_EQ(store->GetStats().reserved, 2u);
  // The second reservation commits first: it wins.
  FillPattern(Key(7), store->segment_base() + second->offset(), 32 * KiB);
  std::memset(store->segment_base() + first->offset(), 0xee, 64 * KiB);
  ASSERT_TRUE(store->Commit(std::move(second).value()).ok());
  EXPECT_EQ(store->Commit(std::move(first).value()).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Get(*store, Key(7), 32 * KiB).ok());
  const DramStats s = store->GetStats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.allocated_bytes, 32 * KiB);  // the loser's slot is freed
}

TEST(DramStoreTest, DestroyedReservationAborts) {
  auto store = OpenStore(SmallOptions());
  {
    auto r = store->Reserve(Key(1), 256 * KiB);
    ASSERT_TRUE(r.ok());
    DramStore::Reservation moved = std::move(r).value();
    EXPECT_TRUE(moved.valid());
    EXPECT_EQ(store->GetStats().allocated_bytes, 256 * KiB);
  }
  DramStats s = store->GetStats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.entries, 0u);
  EXPECT_FALSE(store->Contains(Key(1)));
  // Reset() aborts too, and the key can be reserved again.
  auto r = store->Reserve(Key(1), 256 * KiB);
  ASSERT_TRUE(r.ok());
  r->Reset();
  EXPECT_EQ(store->GetStats().reserved, 0u);
  EXPECT_TRUE(Put(*store, Key(1), 256 * KiB).ok());
}

TEST(DramStoreTest, ResourceExhaustedWhenEverythingPinnedOrReserved) {
  auto store = OpenStore(SmallOptions());  // 16 slabs of 1 MiB
  std::vector<DramStore::Pin> pins;
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(Put(*store, Key(i), MiB).ok());
    auto p = store->Acquire(Key(i));
    ASSERT_TRUE(p.ok());
    pins.push_back(std::move(p).value());
  }
  EXPECT_EQ(store->GetStats().pinned, 16u);
  EXPECT_EQ(store->Reserve(Key(100), MiB).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Reserve(Key(100), 4 * KiB).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Reserve(Key(100), 3 * MiB).status().code(), StatusCode::kResourceExhausted);
  // A second pin of the same entry is independent.
  auto again = store->Acquire(Key(3));
  ASSERT_TRUE(again.ok());
  pins[3].Reset();
  EXPECT_EQ(store->Reserve(Key(100), MiB).status().code(), StatusCode::kResourceExhausted);
  again->Reset();
  EXPECT_EQ(store->GetStats().pinned, 15u);
  // Now exactly key 3 can go.
  {
    Status st = Put(*store, Key(100), MiB);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_FALSE(store->Contains(Key(3)));
  EXPECT_EQ(store->GetStats().evictions, 1u);
  pins.clear();

  // Outstanding reservations block the same way.
  auto store2 = OpenStore(SmallOptions());
  std::vector<DramStore::Reservation> rs;
  for (int i = 0; i < 16; ++i) {
    auto r = store2->Reserve(Key(i), MiB);
    ASSERT_TRUE(r.ok());
    rs.push_back(std::move(r).value());
  }
  EXPECT_EQ(store2->Reserve(Key(99), 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store2->GetStats().reserved, 16u);
  rs.clear();
  EXPECT_EQ(store2->GetStats().reserved, 0u);
  EXPECT_TRUE(Put(*store2, Key(99), 1).ok());
}

TEST(DramStoreTest, RemoveWhilePinnedKeepsSlotUntilUnpinned) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(Put(*store, Key(1), 64 * KiB).ok());
  auto pin = store->Acquire(Key(1));
  ASSERT_TRUE(pin.ok());
  const uint64_t pinned_offset = pin->offset();
  ASSERT_TRUE(store->Remove(Key(1)).ok());
  EXPECT_EQ(store->Remove(Key(1)).code(), StatusCode::kNotFound);
  EXPECT_FALSE(store->Contains(Key(1)));
  EXPECT_EQ(store->Acquire(Key(1)).status().code(), StatusCode::kNotFound);
  DramStats s = store->GetStats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.allocated_bytes, 64 * KiB);  // still held by the pin
  // Churn through the whole store several times: the slot is never handed out.
  for (uint64_t i = 100; i < 100 + 4 * 256; ++i) {
    auto r = store->Reserve(Key(i), 64 * KiB);
    ASSERT_TRUE(r.ok());
    ASSERT_NE(r->offset(), pinned_offset);
    FillPattern(Key(i), store->segment_base() + r->offset(), 64 * KiB);
    ASSERT_TRUE(store->Commit(std::move(r).value()).ok());
  }
  EXPECT_TRUE(CheckPattern(Key(1), store->segment_base() + pinned_offset, 64 * KiB));
  // The key can be put again while the old bytes are still pinned.
  ASSERT_TRUE(Put(*store, Key(1), 64 * KiB).ok());
  pin->Reset();
  EXPECT_TRUE(Get(*store, Key(1), 64 * KiB).ok());
  s = store->GetStats();
  EXPECT_EQ(s.pinned, 0u);
  EXPECT_EQ(s.allocated_bytes, s.entries * 64 * KiB);
}

TEST(DramStoreTest, LargeValuesTakeRunsOfSlabs) {
  auto store = OpenStore(SmallOptions());  // 16 x 1 MiB
  const uint64_t big = 3 * MiB + 5;        // 4 slabs
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put(*store, Key(i), big).ok());
  DramStats s = store->GetStats();
  EXPECT_EQ(s.allocated_bytes, 16 * MiB);
  EXPECT_EQ(s.classes.back().slabs, 16u);
  EXPECT_EQ(s.classes.back().entries, 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Get(*store, Key(i), big).ok());
  // Small values now take slabs from the large class (evicting a run).
  ASSERT_TRUE(Put(*store, Key(10), 4 * KiB).ok());
  s = store->GetStats();
  EXPECT_EQ(s.entries, 4u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.classes.back().slabs, 12u);
  // A 4-slab value now needs a window: it evicts a cold run (or the small slab).
  ASSERT_TRUE(Put(*store, Key(11), 4 * MiB).ok());
  EXPECT_TRUE(Get(*store, Key(11), 4 * MiB).ok());
  s = store->GetStats();
  uint64_t used = 4 * MiB, entries = 1;
  for (int i = 0; i < 4; ++i) {
    if (!store->Contains(Key(i))) continue;
    EXPECT_TRUE(Get(*store, Key(i), big).ok());
    used += big;
    ++entries;
  }
  if (store->Contains(Key(10))) {
    used += 4 * KiB;
    ++entries;
  }
  EXPECT_EQ(s.entries, entries);
  EXPECT_EQ(s.used_bytes, used);
  EXPECT_LE(s.allocated_bytes, 16 * MiB);
}

TEST(DramStoreTest, SlabsMoveToTheClassInUse) {
  DramOptions o = SmallOptions(64 * MiB, 1 * MiB);
  auto store = OpenStore(o);
  for (uint64_t i = 0; i < 4096; ++i) ASSERT_TRUE(Put(*store, Key(i), 16 * KiB).ok());
  DramStats s = store->GetStats();
  EXPECT_EQ(s.entries, 4096u);
  EXPECT_EQ(ClassOf(s, 16 * KiB)->slabs, 64u);
  EXPECT_EQ(s.evictions, 0u);
  // The workload switches to 256 KiB values (4 per slab), 4x the capacity.
  const uint64_t kBig = 1024;
  for (uint64_t i = 0; i < kBig; ++i) ASSERT_TRUE(Put(*store, Key(100000 + i), 256 * KiB).ok());
  s = store->GetStats();
  const DramClassStats* big = ClassOf(s, 256 * KiB);
  const DramClassStats* small = ClassOf(s, 16 * KiB);
  EXPECT_GE(big->slabs, 62u) << "slab moves: " << s.slab_moves;
  EXPECT_EQ(big->slabs + small->slabs, 64u);
  EXPECT_EQ(s.slab_moves, big->slabs);
  EXPECT_EQ(big->entries, big->slabs * 4);
  EXPECT_EQ(small->entries, small->slabs * 64);
  EXPECT_EQ(s.entries, big->entries + small->entries);
  // The most recent values are all there, with their bytes.
  for (uint64_t i = kBig - big->entries / 2; i < kBig; ++i) {
    ASSERT_TRUE(Get(*store, Key(100000 + i), 256 * KiB).ok()) << i;
  }
}

// Two classes turning over the same bytes share the memory, and stop
// trading slabs once balanced.
TEST(DramStoreTest, ActiveClassesShareMemoryWithoutThrashing) {
  DramOptions o = SmallOptions(64 * MiB, 1 * MiB);
  o.prefault = false;
  auto store = OpenStore(o);
  auto put = [&](uint64_t k, uint64_t size) {
    auto r = store->Reserve(Key(k), size);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(store->Commit(std::move(r).value()).ok());
  };
  uint64_t k = 0;
  auto round = [&] {
    for (int j = 0; j < 16; ++j) put(k++, 16 * KiB);
    put(k++, 256 * KiB);
  };
  for (int i = 0; i < 1024; ++i) round();  // 8x the capacity
  const uint64_t moves = store->GetStats().slab_moves;
  for (int i = 0; i < 1024; ++i) round();
  const DramStats s = store->GetStats();
  const uint64_t big = ClassOf(s, 256 * KiB)->slabs, small = ClassOf(s, 16 * KiB)->slabs;
  EXPECT_EQ(big + small, 64u);
  EXPECT_GE(big, 16u);
  EXPECT_GE(small, 16u);
  EXPECT_LE(s.slab_moves - moves, 8u) << big << " " << small;
}

// The benchmark's repro at unit scale: a store full of 1 MiB values never
// read, then 32 MiB of 64 KiB values. The new values fit (32 < 64 MiB) and
// the 1 MiB values are older, so every new value must stay: memory is taken
// from the stale class, not from the new one's own fresh entries.
TEST(DramStoreTest, NewClassTakesMemoryFromStaleClass) {
  for (const char* policy : {"s3fifo", "lru"}) {
    DramOptions o = SmallOptions(64 * MiB, 1 * MiB);
    o.prefault = false;
    o.eviction = policy;
    auto store = OpenStore(o);
    // 2x the store, never read.
    for (uint64_t i = 0; i < 128; ++i) ASSERT_TRUE(Put(*store, Key(i), MiB).ok());
    constexpr uint64_t kNew = 512;  // 32 MiB
    for (uint64_t i = 0; i < kNew; ++i) ASSERT_TRUE(Put(*store, Key(1000 + i), 64 * KiB).ok());
    uint64_t hits = 0;
    for (uint64_t i = 0; i < kNew; ++i) hits += Get(*store, Key(1000 + i), 64 * KiB).ok();
    const DramStats s = store->GetStats();
    EXPECT_EQ(hits, kNew) << policy << ": 64 KiB slabs " << ClassOf(s, 64 * KiB)->slabs;
    EXPECT_EQ(ClassOf(s, 64 * KiB)->slabs, 32u) << policy;
    EXPECT_EQ(ClassOf(s, MiB)->slabs, 32u) << policy;
  }
}

// As a node is written: batches of 16 puts, each a block chain, under
// every policy. A store full of 64 KiB values, put 32x over from 100,000
// keys drawn at random and never read, then 8,000 4 KiB values (about 32
// of the 64 MiB): the new values are the newest and fit, so every one must
// stay, as under one global LRU. The old class's eviction order is not its
// slab order (a key back from the ghost is protected, chains go tail
// first, and freed slots are refilled in place), so each of its slabs was
// touched lately while holding values written long ago. Judged by the
// slabs' last touch, the prefix policies kept 6,975 of the 8,000.
TEST(DramStoreTest, NewClassOfChainsTakesMemoryFromStaleChurnedClass) {
  for (const char* policy : {"prefix", "prefix-fixed", "s3fifo", "lru", "tinylfu"}) {
    DramOptions o = SmallOptions(64 * MiB, 1 * MiB);
    o.prefault = false;
    o.eviction = policy;
    auto store = OpenStore(o);
    std::mt19937_64 rng(7);
    // n puts in chains of 16; key i of them is key_of(i).
    auto put_chains = [&](uint64_t n, uint64_t size, auto key_of) {
      DramStore::ChainPlace chain;
      for (uint64_t i = 0; i < n; ++i) {
        if (i % 16 == 0) chain = {};
        const KeyId key = key_of(i);
        auto r = store->Reserve(key, size);
        if (!r.ok() && r.status().code() == StatusCode::kAlreadyExists) continue;
        ASSERT_TRUE(r.ok()) << policy << " " << i;
        FillPattern(key, store->segment_base() + r->offset(), size);
        ASSERT_TRUE(store->Commit(std::move(r).value(), &chain).ok());
      }
    };
    // 32x the store of puts over 100,000 keys drawn at random, as a
    // benchmark's put run.
    put_chains(32 * 1024, 64 * KiB, [&](uint64_t) { return Key(rng() % 100000); });
    constexpr uint64_t kNew = 8000;
    put_chains(kNew, 4 * KiB, [](uint64_t i) { return Key(1000000 + i); });
    uint64_t hits = 0;
    for (uint64_t i = 0; i < kNew; ++i) hits += Get(*store, Key(1000000 + i), 4 * KiB).ok();
    const DramStats s = store->GetStats();
    EXPECT_EQ(hits, kNew) << policy << ": 4 KiB slabs " << ClassOf(s, 4 * KiB)->slabs
                          << ", slab moves " << s.slab_moves;
  }
}

// The reverse mix: small values first, then big ones.
TEST(DramStoreTest, NewBigClassTakesMemoryFromStaleSmallClass) {
  for (const char* policy : {"s3fifo", "lru"}) {
    DramOptions o = SmallOptions(64 * MiB, 1 * MiB);
    o.prefault = false;
    o.eviction = policy;
    auto store = OpenStore(o);
    // 2x the store, never read.
    for (uint64_t i = 0; i < 2048; ++i) ASSERT_TRUE(Put(*store, Key(i), 64 * KiB).ok());
    constexpr uint64_t kNew = 32;  // 32 MiB
    for (uint64_t i = 0; i < kNew; ++i) ASSERT_TRUE(Put(*store, Key(10000 + i), MiB).ok());
    uint64_t hits = 0;
    for (uint64_t i = 0; i < kNew; ++i) hits += Get(*store, Key(10000 + i), MiB).ok();
    const DramStats s = store->GetStats();
    EXPECT_EQ(hits, kNew) << policy << ": 1 MiB slabs " << ClassOf(s, MiB)->slabs;
    EXPECT_EQ(ClassOf(s, 64 * KiB)->slabs, 32u) << policy;
    // The surviving 64 KiB values are the most recent ones.
    for (uint64_t i = 2048 - 32 * 16; i < 2048; ++i) {
      ASSERT_TRUE(Get(*store, Key(i), 64 * KiB).ok()) << policy << " " << i;
    }
  }
}

// A class that is read keeps its memory against a write-only flood of
// another class: the flood evicts its own (older) values instead.
TEST(DramStoreTest, ReadClassKeepsMemoryAgainstWriteOnlyFlood) {
  for (const char* policy : {"s3fifo", "lru"}) {
    DramOptions o = SmallOptions(64 * MiB, 1 * MiB);
    o.prefault = false;
    o.eviction = policy;
    auto store = OpenStore(o);
    constexpr uint64_t kHot = 256;  // 16 MiB of 64 KiB values
    for (uint64_t i = 0; i < kHot; ++i) ASSERT_TRUE(Put(*store, Key(i), 64 * KiB).ok());
    std::mt19937_64 rng(3);
    uint64_t flood = 1000000, reads = 0, hits = 0;
    for (int round = 0; round < 400; ++round) {  // 25x the store of 1 MiB values
      for (int j = 0; j < 4; ++j) ASSERT_TRUE(Put(*store, Key(flood++), MiB).ok());
      for (int j = 0; j < 16; ++j) {
        const uint64_t k = rng() % kHot;
        ++reads;
        if (Get(*store, Key(k), 64 * KiB).ok()) {
          ++hits;
        } else {
          ASSERT_TRUE(Put(*store, Key(k), 64 * KiB).ok());
        }
      }
    }
    const DramStats s = store->GetStats();
    EXPECT_GE(hits * 100, reads * 90) << policy << ": " << hits << "/" << reads << ", 64 KiB slabs "
                                      << ClassOf(s, 64 * KiB)->slabs;
    EXPECT_EQ(ClassOf(s, 64 * KiB)->slabs, 16u) << policy;
  }
}

// Index and metadata per entry at common KV page sizes, on the default 1 GiB
// store with 4 MiB slabs. Not prefaulted and no bytes written: only metadata
// is measured. The default policy's shadow caches come on top, bounded by
// their sampling rate (at most 1/8 of the keys, and 4,096 per shadow:
// about 10 bytes per entry at 64 KiB, falling as 4,096 / entries beyond
// 32,768 entries), but at least 256 keys a shadow: a store of fewer than
// 2,048 entries (1 MiB values here) pays for them as one of 2,048 does.
TEST(DramStoreTest, IndexBytesPerEntry) {
  for (uint64_t value : {64 * KiB, 1 * MiB}) {
    DramOptions o;
    o.huge_pages = false;
    o.prefault = false;
    auto store = OpenStore(o);
    const uint64_t n = o.capacity_bytes / value;
    for (uint64_t i = 0; i < n; ++i) {
      auto r = store->Reserve(Key(i), value);
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(store->Commit(std::move(r).value()).ok());
    }
    const DramStats s = store->GetStats();
    EXPECT_EQ(s.entries, n);
    EXPECT_EQ(s.evictions, 0u);
    EXPECT_DOUBLE_EQ(s.index_bytes_per_entry, static_cast<double>(s.index_bytes) / n);
    EXPECT_GT(s.eviction.shadow_bytes, 0u);
    // 1 MiB values: 4 a slab. Per entry the slot's 32 bytes of metadata
    // and 8 of its stamp, the index, and a quarter of a slab's record.
    EXPECT_LE(static_cast<double>(s.index_bytes - s.eviction.shadow_bytes) / n, 80.0);
    EXPECT_LE(static_cast<double>(s.eviction.shadow_bytes) / std::max<uint64_t>(n, 2048), 16.0);
    std::printf("value %llu KiB: %llu entries, index_bytes %llu, %.1f bytes/entry (shadows %.1f)\n",
                static_cast<unsigned long long>(value / KiB), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(s.index_bytes), s.index_bytes_per_entry,
                static_cast<double>(s.eviction.shadow_bytes) / n);
  }
}

TEST(DramStoreTest, EvictionListenerSeesIntactBytes) {
  auto store = OpenStore(SmallOptions());
  uint64_t seen = 0, good = 0;
  store->SetEvictionListener(
      [&](const KeyId& key, const uint8_t* data, uint64_t size, const DramStore::Lend*) {
        ++seen;
        if (size == 512 * KiB && CheckPattern(key, data, size)) ++good;
      });
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Put(*store, Key(i), 512 * KiB).ok());
  ASSERT_TRUE(store->Remove(Key(99)).ok());  // removals are not evictions
  const DramStats s = store->GetStats();
  EXPECT_EQ(s.evictions, 100u - 32u);
  EXPECT_EQ(seen, s.evictions);
  EXPECT_EQ(good, seen);
  EXPECT_EQ(s.entries, 31u);
}

// ListEntries lists exactly the committed entries with their sizes, over
// many holds of the lock (16 MiB of 1 KiB and 64 KiB values and a run of
// slabs), and calls fn without the lock: fn calls back into the store.
TEST(DramStoreTest, ListEntriesListsEachCommittedEntryOnceWithoutTheLock) {
  auto store = OpenStore(SmallOptions(16 * MiB));
  std::map<KeyId, uint64_t> want;
  for (int i = 0; i < 6000; ++i) {
    ASSERT_TRUE(Put(*store, Key(i), 1 * KiB).ok());
    want[Key(i)] = 1 * KiB;
  }
  for (int i = 6000; i < 6040; ++i) {
    ASSERT_TRUE(Put(*store, Key(i), 64 * KiB).ok());
    want[Key(i)] = 64 * KiB;
  }
  ASSERT_TRUE(Put(*store, Key(7000), 3 * MiB).ok());
  want[Key(7000)] = 3 * MiB;
  for (int i = 0; i < 6000; i += 7) {
    ASSERT_TRUE(store->Remove(Key(i)).ok());
    want.erase(Key(i));
  }
  auto reservation = store->Reserve(Key(8000), 1 * KiB);  // reserved, not committed
  ASSERT_TRUE(reservation.ok());
  ASSERT_EQ(store->GetStats().entries, want.size());
  std::map<KeyId, uint64_t> got;
  size_t duplicates = 0, not_contained = 0;
  store->ListEntries([&](const KeyId& key, uint64_t size) {
    if (!got.emplace(key, size).second) ++duplicates;
    if (!store->Contains(key)) ++not_contained;  // would deadlock under the lock
  });
  EXPECT_EQ(duplicates, 0u);
  EXPECT_EQ(not_contained, 0u);
  EXPECT_EQ(got, want);
}

// Random puts/gets/removes/pins of mixed sizes (incl. runs) against a model:
// every hit returns exactly the bytes put, and the accounting adds up.
TEST(DramStoreTest, ChurnMatchesReferenceModel) {
  for (const char* policy : {"s3fifo", "lru"}) {
    DramOptions o = SmallOptions(32 * MiB, 1 * MiB);
    o.eviction = policy;
    auto store = OpenStore(o);
    std::mt19937_64 rng(7);
    const uint64_t sizes[] = {1, 4 * KiB, 16 * KiB, 65 * KiB, 100 * KiB, 1 * MiB, 2 * MiB + 3};
    std::map<uint64_t, uint64_t> model;  // key -> size of the committed value
    std::vector<std::pair<uint64_t, DramStore::Pin>> pins;
    uint64_t hits = 0, removed = 0;
    for (int op = 0; op < 12000; ++op) {
      const uint64_t k = rng() % 120;  // ~55 MiB of values for 32 MiB
      const int what = static_cast<int>(rng() % 10);
      auto it = model.find(k);
      if (what < 4) {
        const uint64_t size = sizes[rng() % std::size(sizes)];
        const bool present = it != model.end() && store->Contains(Key(k));
        Status st = Put(*store, Key(k), size);
        if (present) {
          ASSERT_EQ(st.code(), StatusCode::kAlreadyExists);
        } else {
          ASSERT_TRUE(st.ok()) << st.ToString();
          model[k] = size;
        }
      } else if (what < 8) {
        auto pin = store->Acquire(Key(k));
        if (it == model.end()) {
          ASSERT_FALSE(pin.ok());
          continue;
        }
        if (!pin.ok()) continue;  // evicted
        ++hits;
        ASSERT_EQ(pin->size(), it->second);
        ASSERT_TRUE(CheckPattern(Key(k), store->segment_base() + pin->offset(), it->second));
        if (rng() % 8 == 0 && pins.size() < 6) pins.emplace_back(k, std::move(pin).value());
      } else if (what < 9) {
        if (store->Remove(Key(k)).ok()) ++removed;
        model.erase(k);
      } else if (!pins.empty()) {
        const size_t i = rng() % pins.size();
        const auto& [pk, pin] = pins[i];
        ASSERT_TRUE(CheckPattern(Key(pk), store->segment_base() + pin.offset(), pin.size()));
        pins.erase(pins.begin() + static_cast<long>(i));
      }
    }
    pins.clear();
    uint64_t entries = 0, used = 0;
    for (const auto& [k, size] : model) {
      if (!store->Contains(Key(k))) continue;
      ++entries;
      used += size;
      ASSERT_TRUE(Get(*store, Key(k), size).ok());
    }
    const DramStats s = store->GetStats();
    EXPECT_EQ(s.entries, entries) << policy;
    EXPECT_EQ(s.used_bytes, used);
    EXPECT_EQ(s.pinned, 0u);
    EXPECT_EQ(s.reserved, 0u);
    EXPECT_LE(s.allocated_bytes, 32 * MiB);
    EXPECT_GE(s.allocated_bytes, used);
    EXPECT_GT(hits, 500u);
    EXPECT_GT(removed, 100u);
    EXPECT_GT(s.evictions, 1000u);
  }
}

// Eviction age is measured on keys whose id has the low 6 bits of hi clear:
// the time from the last commit or hit to the eviction, on the store's clock.
TEST(DramStoreTest, EvictionAgeIsTheTimeFromLastUseToEvictionOfSampledKeys) {
  MetricsRegistry metrics;
  ManualClock clock;
  DramOptions o = SmallOptions();
  o.eviction = "lru";
  o.clock = &clock;
  auto store = OpenStore(o, &metrics);
  auto sampled = [](uint64_t i) { return KeyId{i << 6, SplitMix(i)}; };
  auto unsampled = [](uint64_t i) { return KeyId{(i << 6) | 1, SplitMix(i)}; };
  constexpr uint64_t kSize = 64 * KiB;
  ASSERT_TRUE(Put(*store, sampled(1), kSize).ok());  // t = 0, never read: age 15 s
  ASSERT_TRUE(Put(*store, sampled(2), kSize).ok());  // t = 0, read at t = 5: age 10 s
  ASSERT_TRUE(Put(*store, sampled(3), kSize).ok());  // removed: no age
  clock.Advance(std::chrono::seconds(5));
  ASSERT_TRUE(store->Acquire(sampled(2)).ok());
  ASSERT_TRUE(store->Remove(sampled(3)).ok());
  clock.Advance(std::chrono::seconds(10));
  uint64_t i = 0;
  while (store->Contains(sampled(1)) || store->Contains(sampled(2))) {
    ASSERT_TRUE(Put(*store, unsampled(i++), kSize).ok());
    ASSERT_LT(i, 10000u);
  }
  EXPECT_EQ(store->GetStats().evictions, 2u);
  for (uint64_t k = 0; k < 20; ++k) ASSERT_TRUE(Put(*store, unsampled(i++), kSize).ok());
  EXPECT_EQ(store->GetStats().evictions, 22u);  // unsampled keys go unmeasured
  Histogram* h = metrics.GetHistogram("kvpool_dram_eviction_age_seconds", "");
  EXPECT_EQ(h->Count(), 2u);
  EXPECT_DOUBLE_EQ(h->Sum(), 25.0);
  EXPECT_DOUBLE_EQ(metrics.ValueOf("kvpool_dram_eviction_age_recent_seconds", {{"window", "1m"}}),
                   12.5);
  clock.Advance(std::chrono::seconds(61));  // out of the minute, inside ten
  EXPECT_TRUE(std::isnan(
      metrics.ValueOf("kvpool_dram_eviction_age_recent_seconds", {{"window", "1m"}})));
  EXPECT_DOUBLE_EQ(metrics.ValueOf("kvpool_dram_eviction_age_recent_seconds", {{"window", "10m"}}),
                   12.5);
}

TEST(DramStoreTest, AnUncommittedPinIsReadableButNeverAnEntryAndItsSlotComesBack) {
  auto store = OpenStore(SmallOptions());
  const KeyId k = Key(7);
  constexpr uint64_t kSize = 10000;
  auto r = store->Reserve(k, kSize);
  ASSERT_TRUE(r.ok());
  FillPattern(k, r->data(), kSize);
  auto pin = store->PinUncommitted(std::move(r).value());
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  EXPECT_EQ(pin->size(), kSize);
  EXPECT_TRUE(CheckPattern(k, store->segment_base() + pin->offset(), kSize));
  EXPECT_FALSE(store->Contains(k));
  EXPECT_EQ(store->Acquire(k).status().code(), StatusCode::kNotFound);
  DramStats s = store->GetStats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.pinned, 1u);
  EXPECT_GT(s.allocated_bytes, 0u);
  const uint64_t offset = pin->offset();
  pin->Reset();
  s = store->GetStats();
  EXPECT_EQ(s.pinned, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.evictions, 0u);
  // Freed, not cleared: the bytes stay as an evicted entry's do until the
  // slot is reused (a removal's are cleared), and the key can be stored for
  // real.
  EXPECT_TRUE(CheckPattern(k, store->segment_base() + offset, kSize));
  ASSERT_TRUE(Put(*store, k, kSize).ok());
  EXPECT_TRUE(store->Contains(k));
}

// Values reserved for a read (fetched from another node, pinned
// uncommitted) take free slots of the read room before anything is evicted;
// writes make room within the capacity as they would without a room, and
// committed entries stay within the capacity's slabs.
TEST(DramStoreTest, TheReadRoomTakesValuesReadFromElsewhereBeforeAnyEviction) {
  constexpr uint64_t kSize = 16 * KiB;
  constexpr int kPuts = 1000;
  DramOptions o = SmallOptions(4 * MiB);
  o.eviction = "lru";
  DramOptions roomy = o;
  roomy.read_room_bytes = MiB;
  auto plain = OpenStore(o);
  auto store = OpenStore(roomy);
  EXPECT_EQ(store->segment_bytes(), 5 * MiB);
  DramStats s = store->GetStats();
  EXPECT_EQ(s.capacity_bytes, 4 * MiB);
  EXPECT_EQ(s.read_room_bytes, MiB);
  EXPECT_EQ(plain->GetStats().read_room_bytes, 0u);

  // Filled far past the capacity, both hold the newest n keys: 4 slabs' worth.
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(Put(*plain, Key(i), kSize).ok()) << i;
    ASSERT_TRUE(Put(*store, Key(i), kSize).ok()) << i;
  }
  const uint64_t n = plain->GetStats().entries;
  ASSERT_EQ(n % 4, 0u);
  const uint64_t per_slab = n / 4;
  ASSERT_GT(per_slab, 50u);
  EXPECT_EQ(store->GetStats().entries, n);
  const int oldest = kPuts - static_cast<int>(n);
  for (int i = oldest - 1; i < kPuts; ++i) EXPECT_EQ(store->Contains(Key(i)), i >= oldest) << i;
  EXPECT_EQ(store->GetStats().evictions, static_cast<uint64_t>(kPuts) - n);

  // A write in progress makes room at once, room or not: the least recent
  // entry goes, as in the store without one.
  {
    auto w = store->Reserve(Key(4000), kSize);
    ASSERT_TRUE(w.ok());
    auto pw = plain->Reserve(Key(4000), kSize);
    ASSERT_TRUE(pw.ok());
    EXPECT_EQ(store->GetStats().evictions, static_cast<uint64_t>(kPuts) - n + 1);
    EXPECT_EQ(plain->GetStats().evictions, static_cast<uint64_t>(kPuts) - n + 1);
    EXPECT_FALSE(store->Contains(Key(oldest)));
    EXPECT_FALSE(plain->Contains(Key(oldest)));
    // Aborted, it gives the place back: the next write takes it.
  }
  ASSERT_TRUE(Put(*store, Key(oldest), kSize).ok());
  ASSERT_TRUE(Put(*plain, Key(oldest), kSize).ok());
  EXPECT_EQ(store->GetStats().evictions, static_cast<uint64_t>(kPuts) - n + 1);
  EXPECT_EQ(plain->GetStats().evictions, static_cast<uint64_t>(kPuts) - n + 1);
  const uint64_t evicted = store->GetStats().evictions;
  // Key(oldest) is now the most recent; Key(oldest + 1) the least.

  // A slab's worth of values fetched for a read: all in the room, nothing goes.
  std::vector<DramStore::Pin> in_flight;
  auto fetch = [&](DramStore& st, uint64_t id) {
    auto r = st.ReserveForRead(Key(id), kSize);
    if (!r.ok()) return false;
    FillPattern(Key(id), r->data(), kSize);
    auto pin = st.PinUncommitted(std::move(r).value());
    if (!pin.ok() || !CheckPattern(Key(id), st.segment_base() + pin->offset(), kSize)) return false;
    in_flight.push_back(std::move(pin).value());
    return true;
  };
  for (uint64_t k = 0; k < per_slab; ++k) ASSERT_TRUE(fetch(*store, 5000 + k)) << k;
  s = store->GetStats();
  EXPECT_EQ(s.evictions, evicted);
  EXPECT_EQ(s.entries, n);
  EXPECT_EQ(s.pinned, per_slab);
  for (int i = oldest; i < kPuts; ++i) EXPECT_TRUE(store->Contains(Key(i))) << i;

  // With the room full, the next one makes the least recent entry go...
  ASSERT_TRUE(fetch(*store, 6000));
  EXPECT_EQ(store->GetStats().evictions, evicted + 1);
  EXPECT_FALSE(store->Contains(Key(oldest + 1)));
  EXPECT_TRUE(store->Contains(Key(oldest + 2)));
  // ...as the first one does in a store without a room.
  const uint64_t plain_evicted = plain->GetStats().evictions;
  ASSERT_TRUE(fetch(*plain, 5000));
  EXPECT_EQ(plain->GetStats().evictions, plain_evicted + 1);
  EXPECT_FALSE(plain->Contains(Key(oldest + 1)));

  // That value sits in a slot of the cache, so a put now makes the next
  // entry go for its own slot: n - 1 entries while it is in flight.
  ASSERT_TRUE(Put(*store, Key(7000), kSize).ok());
  s = store->GetStats();
  EXPECT_EQ(s.evictions, evicted + 2);
  EXPECT_EQ(s.entries, n - 1);
  EXPECT_FALSE(store->Contains(Key(oldest + 2)));
  // Once the reads release their values, only the entries' slots are taken;
  // a put fills the cache back to n, and the one after it makes an entry
  // go: the cache holds n, not n plus the room.
  in_flight.clear();
  s = store->GetStats();
  EXPECT_EQ(s.pinned, 0u);
  uint64_t slot_bytes = 0;
  for (const DramClassStats& c : s.classes) slot_bytes += c.entries > 0 ? c.slot_bytes : 0;
  EXPECT_EQ(s.allocated_bytes, (n - 1) * slot_bytes);
  ASSERT_TRUE(Put(*store, Key(7001), kSize).ok());
  EXPECT_EQ(store->GetStats().evictions, evicted + 2);
  EXPECT_EQ(store->GetStats().entries, n);
  ASSERT_TRUE(Put(*store, Key(7002), kSize).ok());
  s = store->GetStats();
  EXPECT_EQ(s.evictions, evicted + 3);
  EXPECT_EQ(s.entries, n);
  EXPECT_FALSE(store->Contains(Key(oldest + 3)));
  for (int i = oldest + 4; i < kPuts; ++i) EXPECT_TRUE(Get(*store, Key(i), kSize).ok()) << i;
  for (int id : {oldest, 7000, 7001, 7002}) EXPECT_TRUE(Get(*store, Key(id), kSize).ok()) << id;
  for (uint64_t k = 0; k < per_slab; ++k) EXPECT_FALSE(store->Contains(Key(5000 + k)));
}

}  // namespace
}  // namespace kvpool::dram
