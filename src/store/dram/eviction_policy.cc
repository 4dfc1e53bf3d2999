#include "store/dram/eviction_policy.h"

#include <algorithm>
#include <vector>

#include "store/dram/ghost_fifo.h"

namespace kvpool::dram {
namespace {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(SlabAllocator* alloc)
      : alloc_(*alloc), queues_(alloc->num_classes()), ghost_(kMinGhost) {}

  void Insert(uint32_t slot, uint16_t cls) override {
    SlotMeta& m = alloc_.meta(slot);
    m.freq = 0;
    if (ghost_.Take(m.key)) {
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

  void Erase(uint32_t slot, uint16_t cls) override {
    SlotMeta& m = alloc_.meta(slot);
    List(cls, m.queue).Unlink(alloc_, slot);
    m.queue = kQueueNone;
  }

  uint32_t PickVictim(uint16_t cls) override {
    Queues& q = queues_[cls];
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
    return queues_.capacity() * sizeof(Queues) + ghost_.bytes();
  }

 private:
  static constexpr uint64_t kMinGhost = 64;
  // Accessed at least once while in the small queue: promote to main.
  static constexpr uint8_t kPromoteFreq = 1;

  struct Queues {
    SlotList small;
    SlotList main;
  };

  SlotList& List(uint16_t cls, uint8_t queue) {
    KVPOOL_CHECK(queue == kQueueSmall || queue == kQueueMain);
    return queue == kQueueSmall ? queues_[cls].small : queues_[cls].main;
  }

  SlabAllocator& alloc_;
  std::vector<Queues> queues_;
  GhostFifo ghost_;
};

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(SlabAllocator* alloc) : alloc_(*alloc), lists_(alloc->num_classes()) {}

  void Insert(uint32_t slot, uint16_t cls) override {
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

}  // namespace

std::unique_ptr<EvictionPolicy> EvictionPolicy::Create(std::string_view name,
                                                       SlabAllocator* alloc) {
  if (name == "s3fifo") return std::make_unique<S3FifoPolicy>(alloc);
  if (name == "lru") return std::make_unique<LruPolicy>(alloc);
  return nullptr;
}

}  // namespace kvpool::dram
