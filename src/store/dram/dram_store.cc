// DramStore implementation: one mutex (mu_) around all state. The critical
// sections are short (hash probe + a few metadata writes) except when a
// Reserve must evict or move a slab; nothing blocks or does I/O under mu_.
//
// Memory balance between classes ("activity density"). Every Reserve and
// every hit counts its value's bytes as activity of its class; all counts
// halve each time half the capacity's worth of activity has been counted, so
// they measure recent demand. Activity per slab is then the rate at which a
// class turns its memory over (writes) or serves it (hits): equalizing it
// across classes is, for writes, equalizing eviction age, like one global
// FIFO would, while hits keep read memory where it is read. When class C needs a slot and has none free (and no slab is
// unassigned), it takes the least-used reclaimable slab of the class D with
// the lowest activity per slab, but only if D's density is under half of C's;
// otherwise C evicts one of its own entries (S3-FIFO/LRU within the class).
// Memory therefore flows to where it is used, idle classes drain to nothing,
// and the 2x hysteresis keeps two active classes from trading slabs back and
// forth. A class with no slab at all always gets one (else it could never
// start). When C cannot evict (everything pinned), it takes a slab from any
// class that has a reclaimable one. Reclaiming a slab evicts its unpinned
// entries (through the listener); a slab holding a pinned, reserved or
// removed-but-pinned slot is never reclaimed.
#include "store/dram/dram_store.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "common/log.h"
#include "store/dram/eviction_policy.h"
#include "store/dram/segment.h"
#include "store/dram/size_classes.h"
#include "store/dram/slab_allocator.h"
#include "store/dram/slot_index.h"

namespace kvpool {

Status DramOptions::Validate() const {
  if (slab_bytes < 4096 || slab_bytes % 4096 != 0 || slab_bytes > (1ull << 30)) {
    return InvalidArgument("dram: slab_bytes must be a multiple of 4096 in [4 KiB, 1 GiB]");
  }
  if (capacity_bytes < slab_bytes || capacity_bytes % slab_bytes != 0) {
    return InvalidArgument("dram: capacity_bytes must be a positive multiple of slab_bytes");
  }
  if (min_class_bytes == 0 || min_class_bytes > slab_bytes) {
    return InvalidArgument("dram: min_class_bytes must be in [1, slab_bytes]");
  }
  if (!(class_growth > 1.0 && class_growth <= 4.0)) {
    return InvalidArgument("dram: class_growth must be in (1, 4]");
  }
  if (max_value_bytes == 0 || max_value_bytes > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("dram: max_value_bytes must be in [1, 4 GiB)");
  }
  if (eviction != "s3fifo" && eviction != "lru") {
    return InvalidArgument("dram: eviction must be \"s3fifo\" or \"lru\"");
  }
  // Slot ids are 32 bits: slab index, then the slot's index in the slab.
  const uint64_t max_slots = slab_bytes / dram::BuildSizeClasses(min_class_bytes, class_growth,
                                                                   slab_bytes).front();
  uint32_t bits = 0;
  while ((uint64_t{1} << bits) < max_slots) ++bits;
  if (((capacity_bytes / slab_bytes) << bits) >= dram::kNoSlot) {
    return InvalidArgument(
        "dram: too many slots for 32-bit slot ids; raise min_class_bytes or slab_bytes");
  }
  return Status::Ok();
}

namespace dram {
namespace {

using Reservation = DramStore::Reservation;
using Pin = DramStore::Pin;

class DramStoreImpl final : public DramStore {
 public:
  DramStoreImpl(const DramOptions& options, std::unique_ptr<Segment> segment,
                MetricsRegistry* metrics)
      : segment_(std::move(segment)),
        max_value_bytes_(std::min(options.max_value_bytes, options.capacity_bytes)),
        owned_metrics_(metrics == nullptr ? std::make_unique<MetricsRegistry>() : nullptr),
        metrics_(metrics != nullptr ? metrics : owned_metrics_.get()),
        decay_bytes_(options.capacity_bytes / 2),
        alloc_(options.capacity_bytes, options.slab_bytes,
               BuildSizeClasses(options.min_class_bytes, options.class_growth,
                                options.slab_bytes)),
        policy_(EvictionPolicy::Create(options.eviction, &alloc_)),
        activity_(alloc_.num_classes(), 0),
        class_entries_(alloc_.num_classes(), 0) {
    KVPOOL_CHECK(policy_ != nullptr);
    RegisterMetrics();
    OnCapacityChange();
  }

  ~DramStoreImpl() override {
    metrics_->RemoveCallbacks(this);
    std::lock_guard lock(mu_);
    // Handles must not outlive the store (see the header).
    KVPOOL_CHECK(reserved_ == 0 && pinned_ == 0);
  }

  int segment_fd() const override { return segment_->fd(); }
  uint64_t segment_bytes() const override { return segment_->bytes(); }
  uint8_t* segment_base() const override { return segment_->base(); }
  uint64_t max_value_bytes() const override { return max_value_bytes_; }

  Result<Reservation> Reserve(const KeyId& key, uint64_t size) override {
    if (size == 0 || size > max_value_bytes_) {
      return InvalidArgument(size == 0 ? "dram: empty value" : "dram: value over max_value_bytes");
    }
    std::lock_guard lock(mu_);
    if (Find(key) != kNoSlot) return AlreadyExists("dram: key committed");
    const uint16_t cls = alloc_.ClassFor(size);
    NoteActivity(cls, size);
    KVPOOL_ASSIGN_OR_RETURN(const uint32_t slot,
                            cls == alloc_.large_class() ? AllocateRun(size) : AllocateSlot(cls));
    SlotMeta& m = alloc_.meta(slot);
    m.key = key;
    m.size = static_cast<uint32_t>(size);
    m.pins = 0;
    m.freq = 0;
    m.queue = kQueueNone;
    m.state = SlotState::kReserved;
    ++alloc_.slab(alloc_.slab_of(slot)).busy;
    ++reserved_;
    allocated_bytes_ += alloc_.SlotBytes(slot);
    return Reservation(this, slot, key, alloc_.offset(slot), size);
  }

  Status Commit(Reservation reservation) override {
    if (!reservation.valid()) return InvalidArgument("dram: commit of an empty reservation");
    const KeyId key = reservation.key();
    const uint32_t slot = reservation.Release();
    std::lock_guard lock(mu_);
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.state == SlotState::kReserved && m.key == key);
    --reserved_;
    --alloc_.slab(alloc_.slab_of(slot)).busy;
    if (Find(key) != kNoSlot) {
      FreeSlot(slot);
      return AlreadyExists("dram: another writer committed the key first");
    }
    const uint16_t cls = alloc_.class_of(slot);
    m.state = SlotState::kCommitted;
    index_.Insert(key, slot);
    policy_->Insert(slot, cls);
    ++entries_;
    ++class_entries_[cls];
    used_bytes_ += m.size;
    return Status::Ok();
  }

  Result<Pin> Acquire(const KeyId& key) override {
    std::lock_guard lock(mu_);
    const uint32_t slot = Find(key);
    if (slot == kNoSlot) {
      misses_->Inc();
      return NotFound("dram: miss");
    }
    SlotMeta& m = alloc_.meta(slot);
    if (m.pins == std::numeric_limits<uint16_t>::max()) {
      return Unavailable("dram: entry has too many pins");
    }
    if (m.pins++ == 0) {
      ++alloc_.slab(alloc_.slab_of(slot)).busy;
      ++pinned_;
    }
    const uint16_t cls = alloc_.class_of(slot);
    policy_->Touch(slot, cls);
    NoteActivity(cls, m.size);
    hits_->Inc();
    return Pin(this, slot, alloc_.offset(slot), m.size);
  }

  bool Contains(const KeyId& key) const override {
    std::lock_guard lock(mu_);
    return Find(key) != kNoSlot;
  }

  Status Remove(const KeyId& key) override {
    std::lock_guard lock(mu_);
    const uint32_t slot = Find(key);
    if (slot == kNoSlot) return NotFound("dram: miss");
    SlotMeta& m = alloc_.meta(slot);
    const uint16_t cls = alloc_.class_of(slot);
    KVPOOL_CHECK(index_.Erase(key, slot));
    policy_->Erase(slot, cls);
    DropEntry(slot, cls);
    if (m.pins > 0) {
      m.state = SlotState::kZombie;  // freed by the last Unpin
    } else {
      FreeSlot(slot);
    }
    return Status::Ok();
  }

  void SetEvictionListener(EvictionListener listener) override {
    std::lock_guard lock(mu_);
    listener_ = std::move(listener);
  }

  DramStats GetStats() const override {
    std::lock_guard lock(mu_);
    DramStats s;
    s.capacity_bytes = segment_->bytes();
    s.used_bytes = used_bytes_;
    s.allocated_bytes = allocated_bytes_;
    s.entries = entries_;
    s.reserved = reserved_;
    s.pinned = pinned_;
    s.evictions = evictions_;
    s.slab_moves = slab_moves_;
    s.index_bytes = IndexBytes();
    const uint64_t cap = CapacityEntries();
    s.index_bytes_per_entry = cap == 0 ? 0 : static_cast<double>(s.index_bytes) / cap;
    s.huge_pages = segment_->huge_pages();
    for (uint16_t c = 0; c < alloc_.num_classes(); ++c) {
      s.classes.push_back(DramClassStats{alloc_.class_slot_bytes(c), alloc_.class_slabs(c),
                                         class_entries_[c]});
    }
    return s;
  }

 protected:
  void AbortReservation(uint32_t slot) override {
    std::lock_guard lock(mu_);
    KVPOOL_CHECK(alloc_.meta(slot).state == SlotState::kReserved);
    --reserved_;
    --alloc_.slab(alloc_.slab_of(slot)).busy;
    FreeSlot(slot);
  }

  void Unpin(uint32_t slot) override {
    std::lock_guard lock(mu_);
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.pins > 0);
    if (--m.pins > 0) return;
    --pinned_;
    --alloc_.slab(alloc_.slab_of(slot)).busy;
    if (m.state == SlotState::kZombie) FreeSlot(slot);
  }

 private:
  uint32_t Find(const KeyId& key) const {
    const uint32_t slot =
        index_.Find(key, [this](uint32_t s) -> const KeyId& { return alloc_.meta(s).key; });
    return slot == SlotIndex::kNotFound ? kNoSlot : slot;
  }

  // Accounting for an entry leaving the index (evicted or removed).
  void DropEntry(uint32_t slot, uint16_t cls) {
    --entries_;
    --class_entries_[cls];
    used_bytes_ -= alloc_.meta(slot).size;
  }

  void FreeSlot(uint32_t slot) {
    allocated_bytes_ -= alloc_.SlotBytes(slot);
    const bool run = alloc_.class_of(slot) == alloc_.large_class();
    alloc_.Free(slot);
    if (run) OnCapacityChange();
  }

  // REQUIRES: committed, unpinned, already out of the policy's queues.
  void EvictSlot(uint32_t slot) {
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.state == SlotState::kCommitted && m.pins == 0);
    if (listener_) listener_(m.key, segment_->base() + alloc_.offset(slot), m.size);
    KVPOOL_CHECK(index_.Erase(m.key, slot));
    DropEntry(slot, alloc_.class_of(slot));
    ++evictions_;
    evictions_metric_->Inc();
    FreeSlot(slot);
  }

  bool EvictFrom(uint16_t cls) {
    const uint32_t victim = policy_->PickVictim(cls);
    if (victim == kNoSlot) return false;
    EvictSlot(victim);
    return true;
  }

  void NoteActivity(uint16_t cls, uint64_t bytes) {
    activity_[cls] += bytes;
    activity_since_decay_ += bytes;
    if (activity_since_decay_ >= decay_bytes_) {
      for (uint64_t& a : activity_) a >>= 1;
      activity_since_decay_ = 0;
    }
  }

  // Recent activity per slab; infinite for a class without slabs.
  double Density(uint16_t cls) const {
    const uint64_t slabs = alloc_.class_slabs(cls);
    return slabs == 0 ? std::numeric_limits<double>::infinity()
                      : static_cast<double>(activity_[cls]) / static_cast<double>(slabs);
  }
  bool ColderThan(uint16_t donor, uint16_t needy) const {
    return alloc_.class_slabs(donor) > 0 && Density(donor) * 2 < Density(needy);
  }

  // Entries the store holds when full at the current mix: slots of the
  // assigned slabs (runs count one), scaled to all slabs.
  uint64_t CapacityEntries() const {
    const uint64_t assigned = alloc_.assigned_slabs();
    return assigned == 0 ? 0 : alloc_.total_slots() * alloc_.num_slabs() / assigned;
  }

  uint64_t IndexBytes() const {
    return index_.bytes() + alloc_.metadata_bytes() + policy_->bytes() +
           activity_.capacity() * sizeof(uint64_t) + class_entries_.capacity() * sizeof(uint32_t);
  }

  void OnCapacityChange() {
    policy_->SetCapacityEntries(CapacityEntries());
  }

  Result<uint32_t> AllocateSlot(uint16_t cls) {
    for (;;) {
      const uint32_t slot = alloc_.PopFree(cls);
      if (slot != kNoSlot) return slot;
      uint32_t slab = alloc_.FindFreeSlab();
      if (slab == kNoSlab) slab = ReclaimFromDonor(cls, /*any_donor=*/false);
      if (slab == kNoSlab && EvictFrom(cls)) continue;
      if (slab == kNoSlab) slab = ReclaimFromDonor(cls, /*any_donor=*/true);
      if (slab == kNoSlab) return ResourceExhausted("dram: every slot is pinned or reserved");
      alloc_.AssignSlab(slab, cls);
      OnCapacityChange();
    }
  }

  // Reclaims a slab from the coldest class colder than `needy` (or from any
  // class); returns it unassigned, or kNoSlab.
  uint32_t ReclaimFromDonor(uint16_t needy, bool any_donor) {
    donors_.clear();
    for (uint16_t c = 0; c < alloc_.num_classes(); ++c) {
      if (c == needy || alloc_.class_slabs(c) == 0) continue;
      if (any_donor || ColderThan(c, needy)) donors_.emplace_back(Density(c), c);
    }
    std::sort(donors_.begin(), donors_.end());
    for (const auto& [density, donor] : donors_) {
      const uint32_t slab = PickDonorSlab(donor);
      if (slab == kNoSlab) continue;
      ReclaimSlab(slab);
      ++slab_moves_;
      slab_moves_metric_->Inc();
      return slab;
    }
    return kNoSlab;
  }

  // Among the first few reclaimable slabs of `cls` after a rotating cursor,
  // the one with the fewest used slots (fewest entries to evict).
  uint32_t PickDonorSlab(uint16_t cls) {
    constexpr int kCandidates = 8;
    const uint32_t n = alloc_.num_slabs();
    uint32_t best = kNoSlab;
    uint32_t best_used = std::numeric_limits<uint32_t>::max();
    int found = 0;
    for (uint32_t k = 0; k < n && found < kCandidates; ++k) {
      const uint32_t i = (donor_cursor_ + k) % n;
      const Slab& s = alloc_.slab(i);
      if (s.cls != cls || s.busy != 0) continue;
      ++found;
      if (s.used < best_used) {
        best = i;
        best_used = s.used;
      }
    }
    if (best != kNoSlab) donor_cursor_ = (best + 1) % n;
    return best;
  }

  // Evicts every entry of slab i (a whole run for a run's slab) and leaves it
  // unassigned. REQUIRES: reclaimable (no busy slot).
  void ReclaimSlab(uint32_t i) {
    const Slab& s = alloc_.slab(i);
    if (s.cls == kNoClass) return;
    if (s.cls == kRunTail) {
      ReclaimSlab(s.run);
      return;
    }
    KVPOOL_CHECK(s.busy == 0);
    const uint16_t cls = s.cls;
    if (cls == alloc_.large_class()) {
      const uint32_t slot = alloc_.SlotId(i, 0);
      policy_->Erase(slot, cls);
      EvictSlot(slot);  // frees the run
      return;
    }
    for (uint32_t k = 0; k < alloc_.slots_per_slab(cls); ++k) {
      const uint32_t slot = alloc_.SlotId(i, k);
      if (alloc_.meta(slot).state != SlotState::kCommitted) continue;
      policy_->Erase(slot, cls);
      EvictSlot(slot);
    }
    alloc_.UnassignSlab(i);
    OnCapacityChange();
  }

  Result<uint32_t> AllocateRun(uint64_t size) {
    const uint64_t slab_bytes = alloc_.slab_bytes();
    const uint32_t n = static_cast<uint32_t>((size + slab_bytes - 1) / slab_bytes);
    for (;;) {
      const uint32_t first = alloc_.FindFreeRun(n);
      if (first != kNoSlab) {
        const uint32_t slot = alloc_.AssignRun(first, n);
        OnCapacityChange();
        return slot;
      }
      if (ReclaimWindow(n, /*any_donor=*/false)) continue;
      if (EvictFrom(alloc_.large_class())) continue;
      if (ReclaimWindow(n, /*any_donor=*/true)) continue;
      return ResourceExhausted("dram: no run of free or reclaimable slabs for the value");
    }
  }

  // Frees the cheapest window of n contiguous slabs made of unassigned slabs
  // and reclaimable slabs of donor classes (colder than the large class, or
  // any class). Cost: entries to evict. False when no window qualifies.
  bool ReclaimWindow(uint32_t n, bool any_donor) {
    const uint16_t large = alloc_.large_class();
    const uint32_t total = alloc_.num_slabs();
    if (n > total) return false;
    // Per slab: cost to free it, or -1 when it cannot be taken.
    std::vector<int64_t> cost(total);
    for (uint32_t i = 0; i < total; ++i) {
      const Slab& s = alloc_.slab(i);
      const uint32_t head = s.cls == kRunTail ? s.run : i;
      const Slab& h = alloc_.slab(head);
      if (s.cls == kNoClass) {
        cost[i] = 0;
      } else if (h.busy != 0) {
        cost[i] = -1;
      } else if (h.cls == large) {
        cost[i] = any_donor ? 1 : -1;  // without any_donor, the large class evicts in order
      } else {
        cost[i] = (any_donor || ColderThan(h.cls, large)) ? 1 + h.used : -1;
      }
    }
    int64_t best = -1;
    uint32_t best_first = 0;
    int64_t sum = 0;
    uint32_t blocked = 0;
    for (uint32_t i = 0; i < total; ++i) {
      if (cost[i] < 0) ++blocked; else sum += cost[i];
      if (i >= n) {
        if (cost[i - n] < 0) --blocked; else sum -= cost[i - n];
      }
      if (i + 1 >= n && blocked == 0 && (best < 0 || sum < best)) {
        best = sum;
        best_first = i + 1 - n;
      }
    }
    if (best <= 0) return false;  // none, or all free (FindFreeRun would have found it)
    for (uint32_t i = best_first; i < best_first + n; ++i) {
      if (alloc_.slab(i).cls == kNoClass) continue;
      ReclaimSlab(i);
      ++slab_moves_;
      slab_moves_metric_->Inc();
    }
    return true;
  }

  void RegisterMetrics() {
    auto gauge = [this](const char* name, const char* help, auto fn) {
      metrics_->AddCallbackGauge(
          name, help, {},
          [this, fn] {
            std::lock_guard lock(mu_);
            return static_cast<double>(fn());
          },
          this);
    };
    gauge("kvpool_dram_capacity_bytes", "Bytes of the DRAM segment.",
          [this] { return segment_->bytes(); });
    gauge("kvpool_dram_used_bytes", "Bytes of committed values.", [this] { return used_bytes_; });
    gauge("kvpool_dram_allocated_bytes", "Bytes of slots holding committed or reserved values.",
          [this] { return allocated_bytes_; });
    gauge("kvpool_dram_entries", "Committed entries.", [this] { return entries_; });
    gauge("kvpool_dram_pinned", "Slots with at least one pin.", [this] { return pinned_; });
    gauge("kvpool_dram_reserved", "Outstanding reservations.", [this] { return reserved_; });
    gauge("kvpool_dram_index_bytes", "Bytes of index, eviction and slot metadata.",
          [this] { return IndexBytes(); });
    evictions_metric_ = metrics_->GetCounter("kvpool_dram_evictions_total", "Entries evicted.");
    slab_moves_metric_ =
        metrics_->GetCounter("kvpool_dram_slab_moves_total", "Slabs moved between size classes.");
    hits_ = metrics_->GetCounter("kvpool_dram_hits_total", "Acquire hits.");
    misses_ = metrics_->GetCounter("kvpool_dram_misses_total", "Acquire misses.");
  }

  const std::unique_ptr<Segment> segment_;
  const uint64_t max_value_bytes_;
  const std::unique_ptr<MetricsRegistry> owned_metrics_;  // when none was given
  MetricsRegistry* const metrics_;
  const uint64_t decay_bytes_;
  Counter* evictions_metric_ = nullptr;
  Counter* slab_moves_metric_ = nullptr;
  Counter* hits_ = nullptr;
  Counter* misses_ = nullptr;

  mutable std::mutex mu_;
  // Everything below is protected by mu_.
  SlabAllocator alloc_;
  SlotIndex index_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<uint64_t> activity_;       // per class: bytes, decayed
  std::vector<uint32_t> class_entries_;  // per class
  uint64_t activity_since_decay_ = 0;
  uint32_t donor_cursor_ = 0;
  std::vector<std::pair<double, uint16_t>> donors_;  // scratch
  EvictionListener listener_;
  uint64_t used_bytes_ = 0;
  uint64_t allocated_bytes_ = 0;
  uint64_t entries_ = 0;
  uint64_t reserved_ = 0;
  uint64_t pinned_ = 0;
  uint64_t evictions_ = 0;
  uint64_t slab_moves_ = 0;
};

}  // namespace
}  // namespace dram

Result<std::unique_ptr<DramStore>> DramStore::Open(const DramOptions& options,
                                                   MetricsRegistry* metrics) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  dram::SegmentOptions so;
  so.bytes = options.capacity_bytes;
  so.huge_pages = options.huge_pages;
  so.prefault = options.prefault;
  KVPOOL_ASSIGN_OR_RETURN(auto segment, dram::Segment::Create(so));
  return std::unique_ptr<DramStore>(
      new dram::DramStoreImpl(options, std::move(segment), metrics));
}

}  // namespace kvpool
