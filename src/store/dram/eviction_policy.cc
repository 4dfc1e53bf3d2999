#include "store/dram/eviction_policy.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "store/dram/dram_store.h"
#include "store/dram/frequency_sketch.h"
#include "store/dram/ghost_bloom.h"
#include "store/dram/ghost_fifo.h"
#include "store/dram/shadow_shares.h"

namespace kvpool::dram {
namespace {

// A class's two lists, told apart by SlotMeta::queue: kQueueSmall (S3-FIFO's
// small queue, the prefix policy's probation) and kQueueMain (S3-FIFO's
// main queue, the prefix policy's protected list).
struct TwoLists {
  SlotList small;
  SlotList main;
  SlotList& Of(uint8_t queue) {
    KVPOOL_CHECK(queue == kQueueSmall || queue == kQueueMain);
    return queue == kQueueSmall ? small : main;
  }
  // Takes slot out of whichever list holds it (EvictionPolicy::Erase).
  void Erase(SlabAllocator& alloc, uint32_t slot) {
    SlotMeta& m = alloc.meta(slot);
    Of(m.queue).Unlink(alloc, slot);
    m.queue = kQueueNone;
  }
};

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(SlabAllocator* alloc)
      : alloc_(*alloc), queues_(alloc->num_classes()), ghost_(kMinGhost) {}

  void Insert(uint32_t slot, uint16_t cls, uint32_t colder_than, bool returning,
              uint8_t*) override {
    SlotMeta& m = alloc_.meta(slot);
    m.freq = 0;
    if (ghost_.Take(m.key) || returning) {
      m.queue = kQueueMain;
      queues_[cls].main.PushTail(alloc_, slot);
    } else {
      m.queue = kQueueSmall;
      queues_[cls].small.PushTail(alloc_, slot);
    }
  }

  void Touch(uint32_t slot, uint16_t) override {
    SlotMeta& m = alloc_.meta(slot);
    if (m.freq < 3) m.freq = m.freq + 1;
  }

  void Erase(uint32_t slot, uint16_t cls) override { queues_[cls].Erase(alloc_, slot); }

  uint32_t PickVictim(uint16_t cls) override {
    TwoLists& q = queues_[cls];
    const uint64_t small_target = std::max<uint64_t>(1, alloc_.class_slots(cls) / 10);
    // Pinned entries are passed over (back to their queue's tail). Counting
    // them since the last step that changed anything tells when a queue holds
    // nothing but pinned entries; the steps that change something (promote,
    // decrement) are finite, so this ends.
    uint64_t small_pinned = 0, main_pinned = 0;
    for (;;) {
      const bool small_ok = q.small.count > small_pinned;
      const bool main_ok = q.main.count > main_pinned;
      if (!small_ok && !main_ok) return kNoSlot;
      if (small_ok && (q.small.count >= small_target || !main_ok)) {
        const uint32_t slot = q.small.PopHead(alloc_);
        SlotMeta& m = alloc_.meta(slot);
        if (m.pins > 0) {
          q.small.PushTail(alloc_, slot);
          ++small_pinned;
        } else if (m.freq >= kPromoteFreq) {
          m.freq = 0;
          m.queue = kQueueMain;
          q.main.PushTail(alloc_, slot);
          small_pinned = main_pinned = 0;
        } else {
          m.queue = kQueueNone;
          ghost_.Insert(m.key);
          return slot;
        }
      } else {
        const uint32_t slot = q.main.PopHead(alloc_);
        SlotMeta& m = alloc_.meta(slot);
        if (m.pins > 0) {
          q.main.PushTail(alloc_, slot);
          ++main_pinned;
        } else if (m.freq > 0) {
          m.freq = m.freq - 1;
          q.main.PushTail(alloc_, slot);
          small_pinned = main_pinned = 0;
        } else {
          m.queue = kQueueNone;
          return slot;
        }
      }
    }
  }

  void SetCapacityEntries(uint64_t entries) override {
    // The ghost remembers about as many keys as main holds (90%).
    const uint64_t want = std::max<uint64_t>(kMinGhost, entries * 9 / 10);
    if (want > ghost_.capacity() * 5 / 4 || want < ghost_.capacity() * 3 / 4) ghost_.Resize(want);
  }

  uint64_t bytes() const override {
    return queues_.capacity() * sizeof(TwoLists) + ghost_.bytes();
  }

 private:
  static constexpr uint64_t kMinGhost = 64;
  // Accessed at least once while in the small queue: promote to main.
  static constexpr uint8_t kPromoteFreq = 1;

  SlabAllocator& alloc_;
  std::vector<TwoLists> queues_;
  GhostFifo ghost_;
};

// Segmented LRU with a ghost, for LLM prefix traffic (docs/eviction.md): a
// new key enters the probation list (just colder than the entry of its chain
// committed before it, when the store says which); a hit moves it to the
// protected list (at most 70% of the class's slots when it must evict: its
// least recently used entries beyond that go back to probation's warm end
// first); a key
// evicted from probation is remembered in the ghost (for the last one to two
// times the store's entries of such evictions: ghost_bloom.h), and one that
// returns while remembered, or that the writer says left the cache lately
// (Insert's `returning`: another node's eviction, from the directory),
// enters protected at once (just colder than its chain's previous entry
// when that one is protected, so a chain coming back keeps its order).
// Victims come from probation's cold end, then protected's.
//
// Protected ages ("prefix", the default): every kAgeEvery-th victim also
// sends protected's least recently used entry back to probation's warm end.
// While protected is under its share nothing else would move an entry
// there, and one read once long ago, or one that entered from the ghost and
// was never read, would outlive every entry that passes through probation.
// With ageing, an entry that is not read again leaves protected within
// kAgeEvery times protected's size in evictions. The pace is slow on
// purpose: protected entries read now and then are what keeps a scan from
// flushing the cache; a faster pace lost the scan shape's hits at 2 %
// capacity (one in 128: 6 %, one in 32: 23 %; docs/eviction.md). "slru" is
// the policy without ageing, for comparison.
//
// Protected's share adapts ("prefix", the default): no one share keeps the
// most on every traffic (conversations want a large probation, scans and
// shared documents a large protected list; docs/eviction.md), so sampled
// shadow caches run this policy at each of a few shares over the store's
// own traffic, and a share whose shadow clearly keeps more than the
// enforced one's takes its place (shadow_shares.h). At a share of 0 it is
// an LRU of chains (IsLru). "prefix-fixed" keeps 70%, the share it starts
// at.
class PrefixPolicy final : public EvictionPolicy {
 public:
  PrefixPolicy(SlabAllocator* alloc, bool age, bool adapt)
      : EvictionPolicy(/*chains_head_last=*/true),
        alloc_(*alloc),
        age_(age),
        lists_(alloc->num_classes()),
        ghost_(kMinGhost),
        shadows_(adapt ? std::make_unique<ShadowShares>() : nullptr) {}

  void Insert(uint32_t slot, uint16_t cls, uint32_t colder_than, bool returning,
              uint8_t* run) override {
    SlotMeta& m = alloc_.meta(slot);
    if (shadows_ != nullptr && shadows_->Sampled(m.key)) {
      shadows_->Insert(m.key,
                       colder_than == kColdEnd  ? ShadowShares::Place::kColdest
                       : colder_than == kNoSlot ? ShadowShares::Place::kWarm
                                                : ShadowShares::Place::kInChain,
                       returning, run);
    }
    // The list the chain's previous entry is on (kQueueNone: no such entry
    // of this class): the new entry goes just colder than it when it enters
    // the same list, so a chain keeps its order there.
    const uint8_t prev_queue =
        colder_than != kNoSlot && colder_than != kColdEnd && alloc_.class_of(colder_than) == cls
            ? alloc_.meta(colder_than).queue
            : uint8_t{kQueueNone};
    if (IsLru()) {
      // An LRU of chains: probation's warm end, or just colder than the
      // chain's previous entry (no ghost, no replica place).
      m.queue = kQueueSmall;
      if (prev_queue == kQueueSmall) {
        lists_[cls].small.InsertBefore(alloc_, colder_than, slot);
      } else {
        lists_[cls].small.PushTail(alloc_, slot);
      }
      return;
    }
    if (returning || ghost_.Contains(m.key)) {
      SlotList& prot = lists_[cls].main;
      if (prev_queue == kQueueMain) {
        m.queue = kQueueMain;
        prot.InsertBefore(alloc_, colder_than, slot);
      } else if (prot.head != kNoSlot && Bimodal()) {
        m.queue = kQueueMain;
        prot.InsertBefore(alloc_, prot.head, slot);
      } else {
        Protect(slot, cls);
      }
      return;
    }
    m.queue = kQueueSmall;
    SlotList& probation = lists_[cls].small;
    if (prev_queue == kQueueSmall) {
      probation.InsertBefore(alloc_, colder_than, slot);
    } else if (probation.head != kNoSlot && (colder_than == kColdEnd || Bimodal())) {
      probation.InsertBefore(alloc_, probation.head, slot);
    } else {
      probation.PushTail(alloc_, slot);
    }
  }

  void Touch(uint32_t slot, uint16_t cls) override {
    SlotMeta& m = alloc_.meta(slot);
    if (shadows_ != nullptr && shadows_->Sampled(m.key)) shadows_->Touch(m.key);
    if (m.queue == kQueueMain) {
      lists_[cls].main.Unlink(alloc_, slot);
      if (IsLru()) {
        // Left from a share above 0: into the one list, at its warm end.
        m.queue = kQueueSmall;
        lists_[cls].small.PushTail(alloc_, slot);
        return;
      }
      lists_[cls].main.PushTail(alloc_, slot);
      return;
    }
    lists_[cls].small.Unlink(alloc_, slot);
    if (IsLru()) {
      lists_[cls].small.PushTail(alloc_, slot);
      return;
    }
    Protect(slot, cls);
  }

  void BeginHits() override {
    if (shadows_ != nullptr) shadows_->BeginHits();
  }
  void EndHits(uint8_t* run) override {
    if (shadows_ != nullptr) shadows_->EndHits(run);
  }

  void Erase(uint32_t slot, uint16_t cls) override { lists_[cls].Erase(alloc_, slot); }

  uint32_t PickVictim(uint16_t cls) override {
    TwoLists& l = lists_[cls];
    // Protected's share is enforced when the class must give up an entry,
    // so it is measured against the class's slots when full, not while the
    // store still fills.
    const uint64_t tenths = shadows_ != nullptr ? shadows_->share_tenths() : kProtectedTenths;
    const uint64_t share =
        tenths == 0 ? 0 : std::max<uint64_t>(1, alloc_.class_slots(cls) * tenths / 10);
    while (l.main.count > share) Demote(l);
    if (age_ && ++victims_ % kAgeEvery == 0 && l.main.count > 0) Demote(l);
    for (SlotList* list : {&l.small, &l.main}) {
      for (uint32_t slot = list->head; slot != kNoSlot; slot = alloc_.meta(slot).next) {
        SlotMeta& m = alloc_.meta(slot);
        if (m.pins > 0) continue;  // passed over, in place
        if (list == &l.small) ghost_.Insert(m.key);
        list->Unlink(alloc_, slot);
        m.queue = kQueueNone;
        return slot;
      }
    }
    return kNoSlot;
  }

  void SetCapacityEntries(uint64_t entries) override {
    const uint64_t want = std::max<uint64_t>(kMinGhost, entries);
    if (want > ghost_.window() * 5 / 4 || want < ghost_.window() * 3 / 4) ghost_.Resize(want);
    if (shadows_ != nullptr) shadows_->SetCapacityEntries(entries);
  }

  uint64_t bytes() const override {
    return lists_.capacity() * sizeof(TwoLists) + ghost_.bytes() +
           (shadows_ != nullptr ? shadows_->bytes() : 0);
  }

  EvictionAdaptation adaptation() const override {
    EvictionAdaptation a;
    if (shadows_ == nullptr) return a;
    static_assert(EvictionAdaptation::kCandidates == ShadowShares::kCandidates);
    a.adaptive = true;
    a.protected_share = shadows_->share_tenths() / 10.0;
    a.bimodal = shadows_->bimodal();
    for (size_t i = 0; i < ShadowShares::kCandidates; ++i) {
      a.candidate_shares[i] = ShadowShares::kShareTenths[i] / 10.0;
      a.candidate_bimodal[i] = ShadowShares::kBimodal[i];
    }
    a.shadow_hit_ratios = shadows_->hit_ratios();
    a.share_changes = shadows_->changes();
    a.sample_rate = shadows_->rate();
    a.shadow_keys = shadows_->keys();
    a.shadow_bytes = shadows_->bytes();
    a.windows = shadows_->windows();
    return a;
  }

 private:
  static constexpr uint64_t kMinGhost = 64;
  // Protected's share of a class's slots, in tenths, when it does not adapt.
  static constexpr uint64_t kProtectedTenths = 7;
  static_assert(ShadowShares::kShareTenths[ShadowShares::kStart] == kProtectedTenths);
  // One victim in this many also ages protected by one entry.
  static constexpr uint64_t kAgeEvery = 512;

  // Protected's share is 0: the policy is an LRU of chains. Probation is
  // the one list: an entry enters its warm end, or just colder than its
  // chain's previous entry (no ghost), and a hit moves it to the warm end;
  // a batch's hits are touched last to first, as at every share. So it is
  // LruPolicy's order over the same accesses with each batch taken from its
  // last block to its first: the least recently used chain goes first, from
  // its tail, where an LRU that touches in order drops the chain's head and
  // with it the worth of the rest. Entries left on protected from a higher
  // share go to probation's warm end when hit, and all of them when the
  // class must give up an entry. The ghost still learns probation's
  // victims, for when the share rises again.
  bool IsLru() const { return shadows_ != nullptr && shadows_->share_tenths() == 0; }

  // Whether an entry bound for a list's warm end (probation's, or
  // protected's after a ghost hit or as a returning key) goes to its cold
  // end: the chosen candidate inserts bimodally (ShadowShares::kBimodal),
  // and this is not one in kBimodalEvery such entries.
  bool Bimodal() {
    return shadows_ != nullptr && shadows_->bimodal() &&
           ++warm_inserts_ % ShadowShares::kBimodalEvery != 0;
  }

  // Moves a slot (in no list) to protected's warm end.
  void Protect(uint32_t slot, uint16_t cls) {
    alloc_.meta(slot).queue = kQueueMain;
    lists_[cls].main.PushTail(alloc_, slot);
  }

  // Protected's least recently used entry goes to probation's warm end.
  void Demote(TwoLists& l) {
    const uint32_t old = l.main.PopHead(alloc_);
    alloc_.meta(old).queue = kQueueSmall;
    l.small.PushTail(alloc_, old);
  }

  SlabAllocator& alloc_;
  const bool age_;
  std::vector<TwoLists> lists_;  // small: probation, main: protected
  GhostBloom ghost_;
  uint64_t victims_ = 0;
  uint64_t warm_inserts_ = 0;                    // bimodal: entries bound for a list's warm end
  const std::unique_ptr<ShadowShares> shadows_;  // null: the share is fixed
};

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(SlabAllocator* alloc) : alloc_(*alloc), lists_(alloc->num_classes()) {}

  void Insert(uint32_t slot, uint16_t cls, uint32_t colder_than, bool returning,
              uint8_t*) override {
    alloc_.meta(slot).queue = kQueueMain;
    lists_[cls].PushTail(alloc_, slot);
  }
  void Touch(uint32_t slot, uint16_t cls) override {
    lists_[cls].Unlink(alloc_, slot);
    lists_[cls].PushTail(alloc_, slot);
  }
  void Erase(uint32_t slot, uint16_t cls) override {
    lists_[cls].Unlink(alloc_, slot);
    alloc_.meta(slot).queue = kQueueNone;
  }
  uint32_t PickVictim(uint16_t cls) override {
    for (uint32_t slot = lists_[cls].head; slot != kNoSlot; slot = alloc_.meta(slot).next) {
      if (alloc_.meta(slot).pins == 0) {
        Erase(slot, cls);
        return slot;
      }
    }
    return kNoSlot;
  }
  void SetCapacityEntries(uint64_t) override {}
  uint64_t bytes() const override { return lists_.capacity() * sizeof(SlotList); }

 private:
  SlabAllocator& alloc_;
  std::vector<SlotList> lists_;
};

// W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient
// Cache Admission Policy", ACM ToS 2017), an option to compare the prefix
// policy with (docs/eviction.md): a new entry enters a window LRU of 1 % of
// the class's slots; the main part is a segmented LRU (probation, and
// protected at most 80 % of it). When the class must give up an entry, the
// window's least recent entry (the candidate) and main's (the victim)
// contest: the one a frequency sketch has seen less often lately goes, the
// candidate on a tie; a winning candidate enters probation. The sketch
// counts every insert (a write after a miss) and every hit.
class TinyLfuPolicy final : public EvictionPolicy {
 public:
  explicit TinyLfuPolicy(SlabAllocator* alloc)
      : alloc_(*alloc), lists_(alloc->num_classes()), sketch_(kMinCounters, kMinCounters) {}

  void Insert(uint32_t slot, uint16_t cls, uint32_t, bool, uint8_t*) override {
    SlotMeta& m = alloc_.meta(slot);
    sketch_.Increment(m.key);
    Lists& l = lists_[cls];
    m.queue = kQueueWindow;
    l.window.PushTail(alloc_, slot);
    // While the class has room the window's overflow enters main as it
    // comes; once it is full, PickVictim holds the window at its size.
    while (l.window.count > WindowTarget(cls)) Move(l, l.window.head, kQueueSmall);
  }

  void Touch(uint32_t slot, uint16_t cls) override {
    SlotMeta& m = alloc_.meta(slot);
    sketch_.Increment(m.key);
    Lists& l = lists_[cls];
    if (m.queue != kQueueSmall) {
      Move(l, slot, m.queue);  // to its list's warm end
      return;
    }
    Move(l, slot, kQueueMain);
    const uint64_t slots = alloc_.class_slots(cls);
    const uint64_t protected_target = (slots - std::min(slots, WindowTarget(cls))) * 8 / 10;
    while (l.prot.count > std::max<uint64_t>(1, protected_target))
      Move(l, l.prot.head, kQueueSmall);
  }

  void Erase(uint32_t slot, uint16_t cls) override {
    SlotMeta& m = alloc_.meta(slot);
    lists_[cls].Of(m.queue).Unlink(alloc_, slot);
    m.queue = kQueueNone;
  }

  uint32_t PickVictim(uint16_t cls) override {
    Lists& l = lists_[cls];
    uint32_t victim = FirstUnpinned(l.probation);
    if (victim == kNoSlot) victim = FirstUnpinned(l.prot);
    // The entry the newcomer pushes out of a full window contests main's.
    const uint32_t candidate =
        l.window.count >= WindowTarget(cls) ? FirstUnpinned(l.window) : kNoSlot;
    uint32_t out = victim;
    if (candidate != kNoSlot) {
      if (victim != kNoSlot && sketch_.Estimate(alloc_.meta(candidate).key) >
                                   sketch_.Estimate(alloc_.meta(victim).key)) {
        Move(l, candidate, kQueueSmall);
      } else {
        out = candidate;
      }
    } else if (out == kNoSlot) {
      out = FirstUnpinned(l.window);
    }
    if (out != kNoSlot) Erase(out, cls);
    return out;
  }

  void SetCapacityEntries(uint64_t entries) override {
    // Sixteen counters per entry (8 bytes), at least kMinCounters, halved
    // every ten entries' worth of accesses, as the paper sizes its sample.
    // Between halvings one-off keys (ten per entry, in a flood) touch four
    // counters each; at 16 per entry a new key's estimate is rarely raised
    // by others', where at 4 most one-offs of EvictionTest.ScanResistance
    // were admitted on such collisions.
    const uint64_t want = std::bit_ceil(std::max<uint64_t>(kMinCounters, entries * 16));
    if (want != sketch_.counters()) sketch_.Resize(want, std::max<uint64_t>(64, entries * 10));
  }

  uint64_t bytes() const override { return lists_.capacity() * sizeof(Lists) + sketch_.bytes(); }

 private:
  static constexpr uint64_t kMinCounters = 1 << 16;  // 32 KiB
  struct Lists {
    SlotList window;     // kQueueWindow
    SlotList probation;  // kQueueSmall
    SlotList prot;       // kQueueMain
    SlotList& Of(uint8_t queue) {
      KVPOOL_CHECK(queue == kQueueWindow || queue == kQueueSmall || queue == kQueueMain);
      return queue == kQueueWindow ? window : queue == kQueueSmall ? probation : prot;
    }
  };

  uint64_t WindowTarget(uint16_t cls) const {
    return std::max<uint64_t>(1, alloc_.class_slots(cls) / 100);
  }
  // Takes slot out of its list and puts it at the warm end of `queue`'s.
  void Move(Lists& l, uint32_t slot, uint8_t queue) {
    SlotMeta& m = alloc_.meta(slot);
    l.Of(m.queue).Unlink(alloc_, slot);
    m.queue = queue;
    l.Of(queue).PushTail(alloc_, slot);
  }
  uint32_t FirstUnpinned(const SlotList& list) const {
    for (uint32_t slot = list.head; slot != kNoSlot; slot = alloc_.meta(slot).next) {
      if (alloc_.meta(slot).pins == 0) return slot;
    }
    return kNoSlot;
  }

  SlabAllocator& alloc_;
  std::vector<Lists> lists_;
  FrequencySketch sketch_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> EvictionPolicy::Create(std::string_view name,
                                                       SlabAllocator* alloc) {
  static_assert(kEvictionPolicies.size() == 6);
  if (name == kEvictionPolicies[0]) {
    return std::make_unique<PrefixPolicy>(alloc, /*age=*/true, /*adapt=*/true);
  }
  if (name == kEvictionPolicies[1]) return std::make_unique<S3FifoPolicy>(alloc);
  if (name == kEvictionPolicies[2]) return std::make_unique<LruPolicy>(alloc);
  if (name == kEvictionPolicies[3]) {
    return std::make_unique<PrefixPolicy>(alloc, /*age=*/false, /*adapt=*/false);
  }
  if (name == kEvictionPolicies[4]) {
    return std::make_unique<PrefixPolicy>(alloc, /*age=*/true, /*adapt=*/false);
  }
  if (name == kEvictionPolicies[5]) return std::make_unique<TinyLfuPolicy>(alloc);
  return nullptr;
}

}  // namespace kvpool::dram
