// Cache hints' leases in the DRAM tier (DramStore::Retain, PinFor,
// ReleaseLeases, Demote, MarkPrefetched): exact eviction order on hand-made sequences, TTLs on a
// manual clock, the pin budget at the byte, and bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/clock.h"
#include "store/dram/dram_store.h"
#include "store/dram/dram_test_util.h"

namespace kvpool::dram {
namespace {

using std::chrono::nanoseconds;
using std::chrono::seconds;
using testing::Get;
using testing::Key;
using testing::Put;
using testing::SmallOptions;

constexpr uint64_t kValue = 64 * 1024;  // 16 MiB / 64 KiB = 256 slots

class HintsTest : public ::testing::Test {
 protected:
  // An LRU store of 256 entries, 0..255 put in order.
  void Open(uint64_t pin_max_bytes = 4 * kValue) {
    DramOptions o = SmallOptions(16 << 20, 1 << 20);
    o.eviction = "lru";
    o.clock = &clock_;
    o.pin_max_bytes = pin_max_bytes;
    o.hint_max_ttl = seconds(60);
    o.hint_max_keys = 100;
    auto s = DramStore::Open(o, nullptr);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    for (uint64_t k = 0; k < 256; ++k) ASSERT_TRUE(Put(*store_, Key(k), kValue).ok());
  }
  std::vector<KeyId> Keys(std::initializer_list<uint64_t> ks) {
    std::vector<KeyId> out;
    for (uint64_t k : ks) out.push_back(Key(k));
    return out;
  }
  // Puts n new keys from `next_`.
  void Flood(uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(Put(*store_, Key(next_++), kValue).ok());
  }
  std::string Present(std::initializer_list<uint64_t> ks) {
    std::string out;
    for (uint64_t k : ks) out += store_->Contains(Key(k)) ? '1' : '0';
    return out;
  }

  ManualClock clock_;
  std::unique_ptr<DramStore> store_;
  uint64_t next_ = 1000;
};

// Retained entries go after every other entry of their class: a flood of
// 300 keys evicts the 252 others and then its own oldest, not them.
TEST_F(HintsTest, RetainedEntriesGoLast) {
  Open();
  auto r = store_->Retain(Keys({0, 1, 2, 3, 5000}), seconds(10), 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->applied, 4u);
  EXPECT_EQ(r->unknown, 1u);  // never put: counted, not an error
  Flood(300);
  EXPECT_EQ(Present({0, 1, 2, 3, 4, 255}), "111100");
  EXPECT_EQ(Present({1000, 1047, 1048, 1299}), "0011");  // LRU among the rest
  DramStats st = store_->GetStats();
  EXPECT_EQ(st.retained_entries, 4u);
  EXPECT_EQ(st.retained_bytes, 4 * kValue);
  EXPECT_EQ(st.entries, 256u);
  // A read of a retained entry returns its bytes and keeps its lease.
  EXPECT_TRUE(Get(*store_, Key(2), kValue).ok());
  EXPECT_EQ(store_->GetStats().retained_entries, 4u);
}

// When nothing else of the class can go (every other entry pinned for a
// read), retained entries go: the lowest priority first, then the least
// recently retained, and within one hint its last key first (a chain
// retained in order goes from its tail). TTLs do not order them.
TEST_F(HintsTest, RetainedEntriesGoWhenNothingElseCanInTheirOrder) {
  Open();
  ASSERT_TRUE(store_->Retain(Keys({0}), seconds(30), 2).ok());
  ASSERT_TRUE(store_->Retain(Keys({1}), seconds(20), 1).ok());
  ASSERT_TRUE(store_->Retain(Keys({2}), seconds(10), 1).ok());
  ASSERT_TRUE(store_->Retain(Keys({3}), seconds(40), 0).ok());
  ASSERT_TRUE(store_->Retain(Keys({4, 5, 6}), seconds(50), 1).ok());  // a chain
  std::vector<DramStore::Pin> held;
  for (uint64_t k = 7; k < 256; ++k) {
    auto p = store_->Acquire(Key(k));
    ASSERT_TRUE(p.ok());
    held.push_back(std::move(p).value());
  }
  std::string order;
  for (int i = 0; i < 7; ++i) {
    // Each new key is pinned for a read as well, so the next one cannot
    // take it.
    Flood(1);
    auto p = store_->Acquire(Key(next_ - 1));
    ASSERT_TRUE(p.ok());
    held.push_back(std::move(p).value());
    for (uint64_t k = 0; k < 7; ++k) {
      if (!store_->Contains(Key(k)) && order.find(char('0' + k)) == std::string::npos) {
        order += char('0' + k);
      }
    }
  }
  EXPECT_EQ(order, "3126540");
  EXPECT_EQ(store_->GetStats().retained_entries, 0u);
}

// A lease ends exactly at its TTL on the store's clock: the entry then
// returns to the LRU order as if just written, so the next 255 new keys
// leave it and the 256th takes it.
TEST_F(HintsTest, ALeaseEndsExactlyAtItsTtl) {
  Open();
  ASSERT_TRUE(store_->Retain(Keys({0}), seconds(10), 0).ok());
  clock_.Advance(seconds(10) - nanoseconds(1));
  Flood(300);
  EXPECT_EQ(Present({0}), "1");
  EXPECT_EQ(store_->GetStats().leases_expired, 0u);
  clock_.Advance(nanoseconds(1));
  Flood(255);
  EXPECT_EQ(Present({0}), "1");
  EXPECT_EQ(store_->GetStats().leases_expired, 1u);
  EXPECT_EQ(store_->GetStats().retained_entries, 0u);
  Flood(1);
  EXPECT_EQ(Present({0}), "0");
  // A later retention extends a lease, an earlier one does not shorten it.
  ASSERT_TRUE(store_->Retain(Keys({1555}), seconds(5), 0).ok());
  ASSERT_TRUE(store_->Retain(Keys({1555}), seconds(20), 0).ok());
  ASSERT_TRUE(store_->Retain(Keys({1555}), seconds(1), 0).ok());
  clock_.Advance(seconds(19));
  Flood(300);
  EXPECT_EQ(Present({1555}), "1");
  clock_.Advance(seconds(1));
  Flood(256);
  EXPECT_EQ(Present({1555}), "0");
}

// Retained values take at most retain_max_percent of the capacity: past
// it, the least recently retained retentions end (their entries return to
// the LRU order), so retention cannot starve the rest of the cache.
TEST_F(HintsTest, RetentionIsBoundedByItsShareOfTheCapacity) {
  Open();  // 50 %: 128 of the 256 entries
  std::vector<KeyId> first, second;
  for (uint64_t k = 0; k < 100; ++k) first.push_back(Key(k));
  for (uint64_t k = 100; k < 200; ++k) second.push_back(Key(k));
  auto r = store_->Retain(first, seconds(10), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->clipped, 0u);
  r = store_->Retain(second, seconds(10), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->applied, 100u);
  EXPECT_EQ(r->clipped, 72u);  // 200 retained, 128 allowed: the first hint's last 72 go
  DramStats st = store_->GetStats();
  EXPECT_EQ(st.retained_entries, 128u);
  EXPECT_EQ(st.retained_bytes, 128 * kValue);
  EXPECT_EQ(st.retains_clipped, 72u);
  // A flood takes every entry that is not retained: the first hint's last
  // 72 keys among them, its first 28 and the whole second hint stay.
  Flood(400);
  std::string kept;
  for (uint64_t k : {0, 27, 28, 99, 100, 199}) kept += store_->Contains(Key(k)) ? '1' : '0';
  EXPECT_EQ(kept, "110011");
  EXPECT_EQ(store_->GetStats().entries, 256u);
}

// Pinned entries are not evicted, up to the budget at the byte; a batch
// past it changes nothing.
TEST_F(HintsTest, PinsHoldWithinTheirBudgetAtTheByte) {
  Open(/*pin_max_bytes=*/3 * kValue);
  auto over = store_->PinFor(Keys({0, 1, 2, 3}), seconds(10));
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->GetStats().hint_pinned_entries, 0u);
  auto r = store_->PinFor(Keys({0, 1, 2, 2, 7777}), seconds(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->applied, 4u);
  EXPECT_EQ(r->unknown, 1u);
  EXPECT_EQ(store_->GetStats().hint_pinned_bytes, 3 * kValue);
  // Pinned again: no new bytes, within the budget.
  EXPECT_TRUE(store_->PinFor(Keys({1}), seconds(20)).ok());
  EXPECT_EQ(store_->PinFor(Keys({3}), seconds(10)).status().code(), StatusCode::kResourceExhausted);
  Flood(600);
  EXPECT_EQ(Present({0, 1, 2, 3}), "1110");
  EXPECT_EQ(store_->GetStats().entries, 256u);
  // Released and expired pins go back to the LRU order; the budget frees.
  EXPECT_EQ(store_->ReleaseLeases(Keys({0})).applied, 1u);
  clock_.Advance(seconds(10));
  Flood(256);
  EXPECT_EQ(Present({0, 1, 2}), "010");  // 1's pin runs to 20 s
  EXPECT_EQ(store_->GetStats().hint_pinned_bytes, kValue);
  // (1 pinned, so the flood kept its last 255 keys: 1601..1855.)
  EXPECT_EQ(store_->PinFor(Keys({1700, 1701}), seconds(10))->applied, 2u);
  // A removed pinned entry frees its bytes of the budget.
  ASSERT_TRUE(store_->Remove(Key(1)).ok());
  EXPECT_EQ(store_->GetStats().hint_pinned_bytes, 2 * kValue);
  EXPECT_EQ(store_->PinFor(Keys({1702}), seconds(10))->applied, 1u);
  EXPECT_EQ(store_->GetStats().hint_pinned_bytes, 3 * kValue);
}

// A pin replaces a retention; a retention leaves a pin as it is; without a
// budget nothing can be pinned.
TEST_F(HintsTest, APinOutranksARetention) {
  Open();
  ASSERT_TRUE(store_->Retain(Keys({0, 1}), seconds(30), 0).ok());
  ASSERT_TRUE(store_->PinFor(Keys({0}), seconds(10)).ok());
  ASSERT_TRUE(store_->Retain(Keys({0}), seconds(50), 0).ok());
  DramStats st = store_->GetStats();
  EXPECT_EQ(st.retained_entries, 1u);
  EXPECT_EQ(st.hint_pinned_entries, 1u);
  clock_.Advance(seconds(10));
  Flood(300);
  EXPECT_EQ(Present({0, 1}), "01");  // 0's pin ended at 10 s: an LRU entry again

  Open(/*pin_max_bytes=*/0);
  EXPECT_EQ(store_->PinFor(Keys({0}), seconds(1)).status().code(), StatusCode::kResourceExhausted);
}

TEST_F(HintsTest, BadHintsChangeNothing) {
  Open();
  for (nanoseconds ttl :
       {nanoseconds(0), nanoseconds(-1), nanoseconds(seconds(60)) + nanoseconds(1)}) {
    EXPECT_EQ(store_->Retain(Keys({0}), ttl, 0).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store_->PinFor(Keys({0}), ttl).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(store_->Retain(Keys({0}), seconds(60), 0).ok());  // the most is allowed
  std::vector<KeyId> many;
  for (uint64_t k = 10; k < 111; ++k) many.push_back(Key(k));  // 101 keys, over 100
  EXPECT_EQ(store_->Retain(many, seconds(1), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->PinFor(many, seconds(1)).status().code(), StatusCode::kInvalidArgument);
  DramStats st = store_->GetStats();
  EXPECT_EQ(st.retained_entries, 1u);
  EXPECT_EQ(st.hint_pinned_entries, 0u);
  Flood(300);
  EXPECT_EQ(Present({0, 10, 26}), "100");
  // Hints never change the bytes a read returns.
  for (uint64_t k = 1045; k < 1300; ++k) EXPECT_TRUE(Get(*store_, Key(k), kValue).ok()) << k;
  EXPECT_TRUE(Get(*store_, Key(0), kValue).ok());
}

// Demoted entries go first in their class, the first demoted first, ahead
// of the LRU's own victim; a read does not move them back; a demotion ends
// a retention or a pin; a pinned-for-read demoted entry is passed over.
TEST_F(HintsTest, DemotedEntriesGoFirst) {
  Open();
  ASSERT_TRUE(store_->Retain(Keys({200}), seconds(30), 0).ok());
  ASSERT_TRUE(store_->PinFor(Keys({201}), seconds(30)).ok());
  auto r = store_->Demote(Keys({100, 200, 201, 5000}), nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->applied, 3u);
  EXPECT_EQ(r->unknown, 1u);
  ASSERT_TRUE(store_->Demote(Keys({50}), nullptr).ok());
  DramStats st = store_->GetStats();
  EXPECT_EQ(st.demoted_entries, 4u);
  EXPECT_EQ(st.retained_entries, 0u);
  EXPECT_EQ(st.hint_pinned_entries, 0u);
  EXPECT_EQ(st.hint_pinned_bytes, 0u);
  EXPECT_TRUE(Get(*store_, Key(100), kValue).ok());  // a read leaves it first in line
  {
    auto held = store_->Acquire(Key(200));  // pinned for a read: passed over
    ASSERT_TRUE(held.ok());
    Flood(3);
    EXPECT_EQ(Present({100, 200, 201, 50, 0, 1}), "010011");
    Flood(1);
    EXPECT_EQ(Present({200, 0, 1}), "101");  // the LRU's victim next
  }
  Flood(1);
  EXPECT_EQ(Present({200, 1}), "01");  // unpinned: first in line again
  EXPECT_EQ(store_->GetStats().demoted_entries, 0u);

  // Release returns a demoted entry to the LRU order as if just written.
  ASSERT_TRUE(store_->Demote(Keys({2}), nullptr).ok());
  EXPECT_EQ(store_->ReleaseLeases(Keys({2})).applied, 1u);
  Flood(2);
  EXPECT_EQ(Present({2, 3, 4}), "101");

  // Over hint_max_keys: refused, nothing changes.
  std::vector<KeyId> many;
  for (uint64_t k = 10; k < 111; ++k) many.push_back(Key(k));
  EXPECT_EQ(store_->Demote(many, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetStats().demoted_entries, 0u);
}

// Demote with pins: each entry found is pinned without counting a read,
// and its bytes are exact.
TEST_F(HintsTest, DemoteHandsOutPinsOfTheBytes) {
  Open();
  const uint64_t rounds = store_->GetStats().lookup_rounds;
  std::vector<DramStore::Pin> pins;
  auto r = store_->Demote(Keys({7, 9, 5000}), &pins);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(pins.size(), 2u);
  EXPECT_EQ(pins[0].key(), Key(7));
  EXPECT_EQ(pins[1].key(), Key(9));
  EXPECT_TRUE(testing::CheckPattern(Key(9), pins[1].data(), kValue));
  EXPECT_EQ(store_->GetStats().pinned, 2u);
  EXPECT_EQ(store_->GetStats().lookup_rounds, rounds);
  pins.clear();
  EXPECT_EQ(store_->GetStats().pinned, 0u);
}

// A prefetched entry's first read counts one prefetch hit and its lead
// time on the store's clock; later reads count none; one evicted unread
// counts as unused.
TEST_F(HintsTest, PrefetchedEntriesCountTheirFirstRead) {
  Open();
  EXPECT_EQ(store_->MarkPrefetched(Keys({0, 1, 5000})), 2u);
  EXPECT_EQ(store_->GetStats().prefetched_entries, 2u);
  clock_.Advance(std::chrono::milliseconds(1500));
  EXPECT_TRUE(Get(*store_, Key(1), kValue).ok());
  EXPECT_TRUE(Get(*store_, Key(1), kValue).ok());
  DramStats st = store_->GetStats();
  EXPECT_EQ(st.prefetch_hits, 1u);
  EXPECT_DOUBLE_EQ(st.prefetch_lead_seconds, 1.5);
  EXPECT_EQ(st.prefetched_entries, 1u);
  EXPECT_EQ(st.prefetch_unused, 0u);
  Flood(1);  // evicts 0, the LRU's victim, unread
  st = store_->GetStats();
  EXPECT_EQ(Present({0, 1}), "01");
  EXPECT_EQ(st.prefetch_unused, 1u);
  EXPECT_EQ(st.prefetched_entries, 0u);
  // A new entry in the slot 0 had is not marked.
  Flood(300);
  EXPECT_EQ(store_->GetStats().prefetch_hits, 1u);
  for (uint64_t k = 1045; k < 1301; ++k) EXPECT_TRUE(Get(*store_, Key(k), kValue).ok()) << k;
  EXPECT_EQ(store_->GetStats().prefetch_hits, 1u);
}

}  // namespace
}  // namespace kvpool::dram
