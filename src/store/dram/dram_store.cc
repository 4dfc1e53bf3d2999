// DramStore implementation: one mutex (mu_) around all state. The critical
// sections are short (hash probe + a few metadata writes) except when a
// Reserve must evict or move a slab; nothing blocks or does I/O under mu_.
//
// Memory balance between classes: reads first, then age.
//
//  - Reads. Every hit counts its value's bytes as reads of its class; the
//    counts halve each time half the capacity's worth of traffic (bytes
//    committed or hit) has passed, so they measure recent reads. Writes do
//    not count: a write-only flood must not look hot (it did, when writes
//    counted: a new class then evicted its own fresh values instead of
//    taking memory from a stale class).
//  - Age. A clock counts bytes of traffic; each commit or hit stamps its
//    entry with it (SlabAllocator::StampIn, Restamp) and its slab
//    (Slab::last_used), and moves the slab to the tail of its class's slab
//    list, so a class's list head is its least recently used slab. Each
//    slab and class keeps the sum of its entries' stamps, so a slab's mean
//    entry age is known in O(1). A class's eviction age is estimated as
//    twice its entries' mean age (write-only entries' ages spread evenly
//    up to it). A slab's last touch is not its entries' age: a class whose
//    policy does not evict in slab order (chains tail first, keys back from
//    the ghost protected) refills freed slots in place, so every slab looks
//    young while it holds values written long ago.
//
// When class C needs a slot and has none free (and no slab is unassigned),
// each other class D offers its least recently used reclaimable slab (the
// first of its 4 oldest without reserved or pinned slots). D may give it to
// C when D's reads per slab are under half C's (memory flows to where it is
// read; the 2x is hysteresis), or when neither class is read at all and
// the mean age of the slab's entries is above C's eviction age by more
// than half (the oldest write-only data goes first, as in one global LRU;
// the 1.5x is hysteresis, so two write-only classes at equal eviction ages
// do not trade slabs back and forth). Among the classes that may, the
// least read gives, the oldest slab on a tie; the slab's entries are
// evicted (through the listener) and it goes to C. Otherwise C evicts one
// of its own entries (S3-FIFO or LRU within the class). A class without slabs has infinite reads
// per slab, so it always gets one; when C cannot evict (everything pinned or reserved) it takes the
// oldest reclaimable slab of any class. Runs (values above slab_bytes) use the same test per slab
// of a window of contiguous slabs, against the large class's reads and eviction age; else the
// oldest run goes.
//
// Cost: a commit or hit stamps its entry and slab, moves the slab in a list
// (O(1)) and adds to counters (8 bytes per slot for the stamp); a Reserve
// that must make room looks at each class's list head (O(classes)), and
// none when one class holds every slab.
#include "store/dram/dram_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "common/log.h"
#include "common/recent_ratio.h"
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
  if (read_room_bytes % slab_bytes != 0 || read_room_bytes > capacity_bytes) {
    return InvalidArgument(
        "dram: read_room_bytes must be a multiple of slab_bytes, at most capacity_bytes");
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
  if (std::find(kEvictionPolicies.begin(), kEvictionPolicies.end(), eviction) ==
      kEvictionPolicies.end()) {
    std::string names;
    for (std::string_view n : kEvictionPolicies)
      names += (names.empty() ? "" : ", ") + std::string(n);
    return InvalidArgument("dram: eviction must be one of " + names);
  }
  if (hint_max_ttl <= std::chrono::nanoseconds::zero()) {
    return InvalidArgument("dram: hint_max_ttl must be positive");
  }
  if (hint_max_keys == 0) return InvalidArgument("dram: hint_max_keys must be at least 1");
  if (retain_max_percent == 0 || retain_max_percent > 100) {
    return InvalidArgument("dram: retain_max_percent must be in 1..100");
  }
  // Slot ids are 32 bits: slab index, then the slot's index in the slab.
  const uint64_t max_slots = slab_bytes / dram::BuildSizeClasses(min_class_bytes, class_growth,
                                                                   slab_bytes).front();
  uint32_t bits = 0;
  while ((uint64_t{1} << bits) < max_slots) ++bits;
  if ((((capacity_bytes + read_room_bytes) / slab_bytes) << bits) >= dram::kNoSlot) {
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
        cache_bytes_(options.capacity_bytes),
        cache_slabs_(options.capacity_bytes / options.slab_bytes),
        cache_share_(cache_slabs_ << 32),
        has_read_room_(options.read_room_bytes > 0),
        time_(options.clock != nullptr ? options.clock : SystemClock::Get()),
        recent_age_us_(time_),
        pin_max_bytes_(options.pin_max_bytes),
        hint_max_ttl_(options.hint_max_ttl),
        hint_max_keys_(options.hint_max_keys),
        retain_max_bytes_(options.capacity_bytes * options.retain_max_percent / 100),
        alloc_(options.capacity_bytes + options.read_room_bytes, options.slab_bytes,
               BuildSizeClasses(options.min_class_bytes, options.class_growth, options.slab_bytes)),
        policy_(EvictionPolicy::Create(options.eviction, &alloc_)),
        read_bytes_(alloc_.num_classes(), 0) {
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
  uint64_t hint_max_keys() const override { return hint_max_keys_; }
  bool touch_chains_head_last() const override { return policy_->TouchChainsHeadLast(); }

  Result<Reservation> Reserve(const KeyId& key, uint64_t size) override {
    return ReserveSlot(key, size, /*for_read=*/false);
  }
  Result<Reservation> ReserveForRead(const KeyId& key, uint64_t size) override {
    return ReserveSlot(key, size, /*for_read=*/true);
  }

  Result<Reservation> ReserveSlot(const KeyId& key, uint64_t size, bool for_read) {
    if (size == 0 || size > max_value_bytes_) {
      return InvalidArgument(size == 0 ? "dram: empty value" : "dram: value over max_value_bytes");
    }
    std::lock_guard lock(mu_);
    if (Find(key) != kNoSlot) return AlreadyExists("dram: key committed");
    const uint16_t cls = alloc_.ClassFor(size);
    const uint64_t share = ShareOf(cls, size);
    // With a read room, a write makes room within the capacity first, as
    // the allocation would without one, and leaves the room to reads.
    // (Without one the allocation does it: every slot lies inside the
    // capacity's slabs.)
    if (!for_read && has_read_room_ && counted_share_ + share > cache_share_) {
      FitCapacity(cls, share, nullptr);
    }
    KVPOOL_ASSIGN_OR_RETURN(const uint32_t slot,
                            cls == alloc_.large_class() ? AllocateRun(size) : AllocateSlot(cls));
    SlotMeta& m = alloc_.meta(slot);
    m.key = key;
    m.size = static_cast<uint32_t>(size);
    m.pins = 0;
    m.freq = 0;
    m.queue = kQueueNone;
    m.prefetched = 0;
    m.state = SlotState::kReserved;
    m.for_read = for_read;
    if (!for_read) counted_share_ += SlabShare(slot);
    ++alloc_.slab(alloc_.slab_of(slot)).busy;
    ++reserved_;
    allocated_bytes_ += alloc_.SlotBytes(slot);
    return Reservation(this, slot, key, alloc_.offset(slot), size);
  }

  // A reservation leaving the reserved state: its share stops counting.
  void Unreserve(uint32_t slot) {
    SlotMeta& m = alloc_.meta(slot);
    if (!m.for_read) counted_share_ -= SlabShare(slot);
    m.for_read = 0;
    --reserved_;
    --alloc_.slab(alloc_.slab_of(slot)).busy;
  }

  Status Commit(Reservation reservation, ChainPlace* chain, bool returning) override {
    if (!reservation.valid()) return InvalidArgument("dram: commit of an empty reservation");
    const KeyId key = reservation.key();
    const uint32_t slot = reservation.Release();
    std::lock_guard lock(mu_);
    // The chain's previous entry, if it is still the one committed then;
    // only a policy that keeps chains from their head uses it.
    if (!policy_->TouchChainsHeadLast()) chain = nullptr;
    uint32_t colder_than = kNoSlot;
    if (chain != nullptr && chain->slot == ChainPlace::kByKey) {
      colder_than = Find(chain->key);
    } else if (chain != nullptr && chain->slot != kNoSlot && Find(chain->key) == chain->slot) {
      colder_than = chain->slot;
    }
    Status s =
        CommitLocked(key, slot, colder_than, returning, chain != nullptr ? &chain->run : nullptr);
    if (s.ok() && chain != nullptr) {
      chain->slot = slot;
      chain->key = key;
    }
    return s;
  }

  Result<Pin> CommitAndAcquire(Reservation reservation, bool replica) override {
    if (!reservation.valid()) return InvalidArgument("dram: commit of an empty reservation");
    const KeyId key = reservation.key();
    const uint32_t slot = reservation.Release();
    std::lock_guard lock(mu_);
    Status s = CommitLocked(key, slot, replica ? kColdEnd : kNoSlot);
    if (!s.ok() && s.code() != StatusCode::kAlreadyExists) return s;
    // A replica's pin is part of its write; another writer's entry was hit.
    return AcquireLocked(key, /*touch=*/!replica || !s.ok());
  }

  Result<Pin> PinUncommitted(Reservation reservation) override {
    if (!reservation.valid()) return InvalidArgument("dram: pin of an empty reservation");
    const KeyId key = reservation.key();
    const uint32_t slot = reservation.Release();
    std::lock_guard lock(mu_);
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.state == SlotState::kReserved && m.key == key && m.pins == 0);
    // Reserved and pinned both keep the slab busy: the count stays.
    Unreserve(slot);
    ++alloc_.slab(alloc_.slab_of(slot)).busy;
    ++pinned_;
    m.pins = 1;
    // Freed by the Unpin, not cleared: the bytes are a value this store's
    // clients may read, like an evicted entry's until its slot is reused,
    // and clearing them would hold the lock for a pass over every byte.
    m.state = SlotState::kUnlisted;
    return Pin(this, slot, key, alloc_.offset(slot), m.size);
  }

  void ForEachEntry(const EntryVisitor& fn) const override {
    std::lock_guard lock(mu_);
    for (uint32_t si = 0; si < alloc_.num_slabs(); ++si) {
      ForEachInSlabLocked(si, [&](uint32_t slot, const SlotMeta& m) {
        fn(m.key, segment_->base() + alloc_.offset(slot), m.size);
      });
    }
  }

  void ListEntries(const std::function<void(const KeyId&, uint64_t)>& fn) const override {
    // Slots examined per hold of the lock: about 100 us of work.
    constexpr uint32_t kSlotsPerHold = 4096;
    std::vector<std::pair<KeyId, uint64_t>> batch;
    for (uint32_t si = 0;;) {
      batch.clear();
      {
        std::lock_guard lock(mu_);
        if (si >= alloc_.num_slabs()) return;
        for (uint32_t seen = 0; si < alloc_.num_slabs() && seen < kSlotsPerHold; ++si) {
          seen += ForEachInSlabLocked(si, [&](uint32_t, const SlotMeta& m) {
            batch.emplace_back(m.key, m.size);
          });
        }
      }
      for (const auto& [key, size] : batch) fn(key, size);
    }
  }

  // Calls fn(slot, meta) for each committed entry of slab si; returns the
  // slots examined. Under mu_.
  template <typename Fn>
  uint32_t ForEachInSlabLocked(uint32_t si, Fn&& fn) const {
    const Slab& slab = alloc_.slab(si);
    if (slab.meta == nullptr || slab.cls == kNoClass || slab.cls == kRunTail) return 1;
    const uint32_t n = slab.cls == alloc_.large_class() ? 1 : alloc_.slots_per_slab(slab.cls);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t slot = alloc_.SlotId(si, i);
      const SlotMeta& m = alloc_.meta(slot);
      if (m.state != SlotState::kCommitted || Find(m.key) != slot) continue;
      fn(slot, m);
    }
    return n;
  }

  Result<Pin> Acquire(const KeyId& key) override {
    std::lock_guard lock(mu_);
    ++lookup_rounds_;
    return AcquireLocked(key);
  }

  size_t AcquireBatch(std::span<const KeyId> keys, std::span<Pin> pins, uint8_t* run) override {
    KVPOOL_CHECK(pins.size() == keys.size());
    const size_t n = keys.size();
    size_t pinned = 0;
    std::lock_guard lock(mu_);
    ++lookup_rounds_;
    const bool head_last = policy_->TouchChainsHeadLast();
    policy_->BeginHits();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = head_last ? n - 1 - k : k;
      if (pins[i].valid()) continue;
      auto p = AcquireLocked(keys[i]);
      if (!p.ok()) continue;
      pins[i] = std::move(p).value();
      ++pinned;
    }
    policy_->EndHits(run);
    return pinned;
  }

  Result<HintResult> Retain(std::span<const KeyId> keys, std::chrono::nanoseconds ttl,
                            uint8_t priority) override {
    KVPOOL_RETURN_IF_ERROR(CheckHint(keys.size(), ttl));
    std::lock_guard lock(mu_);
    ExpireLeases();
    const uint64_t expiry = NowNs() + static_cast<uint64_t>(ttl.count());
    NewLeaseBatch();
    HintResult r = ForEachFound(keys, [&](uint32_t slot) {
      SlotMeta& m = alloc_.meta(slot);
      if (m.hint == kHintPinned) return;
      const uint16_t cls = alloc_.class_of(slot);
      uint64_t until = expiry;
      if (m.hint == kHintRetained) {
        until = std::max(until, leases_.at(slot).expiry_ns);
        DropLease(slot, cls);
      } else if (m.hint == kHintDemoted) {
        DropLease(slot, cls);
      } else {
        policy_->Erase(slot, cls);
      }
      AddLease(slot, cls, kHintRetained, until, priority);
    });
    // Within the bound: retentions end in the order their entries would go.
    while (retained_bytes_ > retain_max_bytes_) {
      EndLease(std::get<3>(*retained_all_.begin()));
      ++retains_clipped_;
      ++r.clipped;
    }
    return r;
  }

  Result<HintResult> PinFor(std::span<const KeyId> keys, std::chrono::nanoseconds ttl) override {
    KVPOOL_RETURN_IF_ERROR(CheckHint(keys.size(), ttl));
    std::lock_guard lock(mu_);
    ExpireLeases();
    // The bytes this batch would newly pin, each entry once: past the
    // budget, nothing is pinned.
    std::vector<uint32_t> slots;
    slots.reserve(keys.size());
    const HintResult r = ForEachFound(keys, [&](uint32_t slot) { slots.push_back(slot); });
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    uint64_t adding = 0;
    for (uint32_t slot : slots) {
      if (alloc_.meta(slot).hint != kHintPinned) adding += alloc_.meta(slot).size;
    }
    if (hint_pinned_bytes_ + adding > pin_max_bytes_) {
      return ResourceExhausted("dram: pins would hold " +
                               std::to_string(hint_pinned_bytes_ + adding) +
                               " bytes, over the pin budget of " + std::to_string(pin_max_bytes_));
    }
    const uint64_t expiry = NowNs() + static_cast<uint64_t>(ttl.count());
    NewLeaseBatch();
    for (uint32_t slot : slots) {
      SlotMeta& m = alloc_.meta(slot);
      const uint16_t cls = alloc_.class_of(slot);
      uint64_t until = expiry;
      if (m.hint == kHintNone) {
        policy_->Erase(slot, cls);
      } else {
        if (m.hint == kHintPinned) until = std::max(until, leases_.at(slot).expiry_ns);
        DropLease(slot, cls);
      }
      AddLease(slot, cls, kHintPinned, until, 0);
    }
    return r;
  }

  HintResult ReleaseLeases(std::span<const KeyId> keys) override {
    std::lock_guard lock(mu_);
    ExpireLeases();
    return ForEachFound(keys, [&](uint32_t slot) {
      if (alloc_.meta(slot).hint != kHintNone) EndLease(slot);
    });
  }

  Result<HintResult> Demote(std::span<const KeyId> keys, std::vector<Pin>* pins) override {
    KVPOOL_RETURN_IF_ERROR(CheckHintKeys(keys.size()));
    std::lock_guard lock(mu_);
    ExpireLeases();
    NewLeaseBatch();
    return ForEachFound(keys, [&](uint32_t slot) {
      SlotMeta& m = alloc_.meta(slot);
      const uint16_t cls = alloc_.class_of(slot);
      if (m.hint != kHintDemoted) {
        OrderErase(slot, cls);
        AddLease(slot, cls, kHintDemoted, 0, 0);
      }
      // An entry at the most pins stays (first in line) rather than fail.
      if (pins != nullptr && m.pins < std::numeric_limits<uint16_t>::max()) {
        pins->push_back(PinLocked(slot));
      }
    });
  }

  uint64_t MarkPrefetched(std::span<const KeyId> keys) override {
    std::lock_guard lock(mu_);
    const uint64_t now = NowNs();
    return ForEachFound(keys,
                        [&](uint32_t slot) {
                          SlotMeta& m = alloc_.meta(slot);
                          m.prefetched = 1;
                          prefetched_at_[slot] = now;
                        })
        .applied;
  }

  bool Contains(const KeyId& key) const override {
    std::lock_guard lock(mu_);
    ++lookup_rounds_;
    return Find(key) != kNoSlot;
  }

  Status Remove(const KeyId& key, uint64_t* removed_size = nullptr) override {
    std::lock_guard lock(mu_);
    const uint32_t slot = Find(key);
    if (slot == kNoSlot) return NotFound("dram: miss");
    SlotMeta& m = alloc_.meta(slot);
    if (removed_size != nullptr) *removed_size = m.size;
    const uint16_t cls = alloc_.class_of(slot);
    KVPOOL_CHECK(index_.Erase(key, slot));
    OrderErase(slot, cls);
    DropEntry(slot);
    if (m.pins > 0) {
      m.state = SlotState::kZombie;  // cleared and freed by the last Unpin
    } else {
      ClearAndFreeSlot(slot);
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
    s.capacity_bytes = cache_bytes_;
    s.read_room_bytes = segment_->bytes() - cache_bytes_;
    s.used_bytes = used_bytes_;
    s.allocated_bytes = allocated_bytes_;
    s.entries = entries_;
    s.reserved = reserved_;
    s.pinned = pinned_;
    s.evictions = evictions_;
    s.lent = lent_;
    s.slab_moves = slab_moves_;
    s.lookup_rounds = lookup_rounds_;
    s.index_bytes = IndexBytes();
    s.retained_entries = retained_all_.size();
    s.retained_bytes = retained_bytes_;
    s.hint_pinned_entries = leases_.size() - retained_all_.size() - demoted_.size();
    s.demoted_entries = demoted_.size();
    s.prefetched_entries = prefetched_at_.size();
    s.prefetch_hits = prefetch_hits_;
    s.prefetch_unused = prefetch_unused_;
    s.prefetch_lead_seconds = static_cast<double>(prefetch_lead_ns_) / 1e9;
    s.hint_pinned_bytes = hint_pinned_bytes_;
    s.leases_expired = leases_expired_;
    s.retains_clipped = retains_clipped_;
    s.eviction = policy_->adaptation();
    const uint64_t cap = CapacityEntries();
    s.index_bytes_per_entry = cap == 0 ? 0 : static_cast<double>(s.index_bytes) / cap;
    s.huge_pages = segment_->huge_pages();
    s.huge_page_bytes = segment_->huge_page_bytes();
    for (uint16_t c = 0; c < alloc_.num_classes(); ++c) {
      s.classes.push_back(DramClassStats{alloc_.class_slot_bytes(c), alloc_.class_slabs(c),
                                         alloc_.class_entries(c)});
    }
    return s;
  }

 protected:
  void AbortReservation(uint32_t slot) override {
    std::lock_guard lock(mu_);
    KVPOOL_CHECK(alloc_.meta(slot).state == SlotState::kReserved);
    Unreserve(slot);
    FreeSlot(slot);
  }

  void Unpin(uint32_t slot) override {
    std::lock_guard lock(mu_);
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.pins > 0);
    if (--m.pins > 0) return;
    --pinned_;
    --alloc_.slab(alloc_.slab_of(slot)).busy;
    if (m.state == SlotState::kZombie) {
      ClearAndFreeSlot(slot);
    } else if (m.state == SlotState::kUnlisted) {
      FreeSlot(slot);
    }
  }

 private:
  uint32_t Find(const KeyId& key) const {
    const uint32_t slot =
        index_.Find(key, [this](uint32_t s) -> const KeyId& { return alloc_.meta(s).key; });
    return slot == SlotIndex::kNotFound ? kNoSlot : slot;
  }

  // Accounting for an entry leaving the index (evicted or removed).
  void DropEntry(uint32_t slot) {
    if (alloc_.meta(slot).prefetched) NotePrefetchedRead(slot, /*read=*/false);
    if (AgeSampled(alloc_.meta(slot).key)) age_last_use_.erase(alloc_.meta(slot).key);
    alloc_.StampOut(slot);
    --entries_;
    used_bytes_ -= alloc_.meta(slot).size;
    counted_share_ -= SlabShare(slot);
  }

  // Makes the entries and writes in progress leave room in the capacity
  // for one more of class cls (share), the way AllocateSlot makes a slot
  // when memory is full: a slab of a class that may donate, else the
  // class's own victim, else the oldest free-able slab of any class. Gives
  // up when everything is pinned or reserved (the value then takes a slot of
  // the room until evictions bring the cache back under). *colder_than (if
  // given): a chain's previous entry, kNoSlot if it went.
  void FitCapacity(uint16_t cls, uint64_t share, uint32_t* colder_than) {
    while (counted_share_ + share > cache_share_) {
      uint32_t slab = TakeSlab(cls, /*any_donor=*/false);
      if (slab == kNoSlab && !EvictFrom(cls, /*may_lend=*/true)) {
        slab = TakeSlab(cls, /*any_donor=*/true);
        if (slab == kNoSlab) break;
      }
      if (slab != kNoSlab && cls != alloc_.large_class()) {  // a run finds it free
        alloc_.AssignSlab(slab, cls);
        alloc_.TouchSlab(slab, clock_);
        OnCapacityChange();
      }
      if (colder_than != nullptr && *colder_than < kColdEnd &&
          alloc_.meta(*colder_than).state != SlotState::kCommitted) {
        *colder_than = kNoSlot;
      }
    }
  }

  // The part of the memory a committed entry in slot takes, in units of
  // 2^-32 slab: one slot of its slab's (slot bytes and a share of the slab's
  // tail), or the whole run. Rounded down: without a read room the cap in
  // CommitLocked never evicts, and with one a full cache holds at most
  // slabs x slots_per_slab^2 / 2^32 entries more than its slabs would.
  uint64_t SlabShare(uint32_t slot) const {
    return ShareOf(alloc_.class_of(slot), alloc_.SlotBytes(slot));
  }
  // The same for a value of `bytes` in class cls, before it has a slot.
  uint64_t ShareOf(uint16_t cls, uint64_t bytes) const {
    if (cls != alloc_.large_class()) return (uint64_t{1} << 32) / alloc_.slots_per_slab(cls);
    return (bytes + alloc_.slab_bytes() - 1) / alloc_.slab_bytes() << 32;
  }

  // REQUIRES: mu_ held; slot reserved for key. colder_than: a committed
  // entry this one follows in its chain (EvictionPolicy::Insert), or kNoSlot.
  Status CommitLocked(const KeyId& key, uint32_t slot, uint32_t colder_than = kNoSlot,
                      bool returning = false, uint8_t* run = nullptr) {
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.state == SlotState::kReserved && m.key == key);
    Unreserve(slot);
    if (Find(key) != kNoSlot) {
      FreeSlot(slot);
      return AlreadyExists("dram: another writer committed the key first");
    }
    const uint16_t cls = alloc_.class_of(slot);
    // Entries stay within the capacity, the read room is for values in
    // flight: a write made room when it reserved, a value reserved for a
    // read and kept (a replica) makes it now.
    const uint64_t share = SlabShare(slot);
    if (counted_share_ + share > cache_share_) FitCapacity(cls, share, &colder_than);
    m.state = SlotState::kCommitted;
    index_.Insert(key, slot);
    policy_->Insert(slot, cls, colder_than, returning, run);
    NoteUse(slot, cls, m.size, /*hit=*/false);
    NoteAgeUse(key);
    ++entries_;
    used_bytes_ += m.size;
    counted_share_ += share;
    return Status::Ok();
  }

  // REQUIRES: mu_ held.
  Result<Pin> AcquireLocked(const KeyId& key, bool touch = true) {
    const uint32_t slot = Find(key);
    if (slot == kNoSlot) {
      misses_->Inc();
      return NotFound("dram: miss");
    }
    SlotMeta& m = alloc_.meta(slot);
    if (m.pins == std::numeric_limits<uint16_t>::max()) {
      return Unavailable("dram: entry has too many pins");
    }
    const uint16_t cls = alloc_.class_of(slot);
    if (touch) {
      // A leased entry keeps its place in the lease order.
      if (m.hint == kHintNone) policy_->Touch(slot, cls);
      NoteAgeUse(key);
      if (m.prefetched) NotePrefetchedRead(slot, /*read=*/true);
    }
    NoteUse(slot, cls, m.size, /*hit=*/true);
    hits_->Inc();
    return PinLocked(slot);
  }

  // REQUIRES: mu_ held; slot committed with fewer than the most pins. A
  // pin that is no access (not counted, not touched).
  Pin PinLocked(uint32_t slot) {
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.pins < std::numeric_limits<uint16_t>::max());
    if (m.pins++ == 0) {
      ++alloc_.slab(alloc_.slab_of(slot)).busy;
      ++pinned_;
    }
    return Pin(this, slot, m.key, alloc_.offset(slot), m.size);
  }

  // REQUIRES: mu_ held; slot prefetched. Its first read (read) or its
  // leaving unread ends the mark.
  void NotePrefetchedRead(uint32_t slot, bool read) {
    alloc_.meta(slot).prefetched = 0;
    auto it = prefetched_at_.find(slot);
    KVPOOL_CHECK(it != prefetched_at_.end());
    if (read) {
      const uint64_t now = NowNs();
      const uint64_t lead = now > it->second ? now - it->second : 0;
      ++prefetch_hits_;
      prefetch_lead_ns_ += lead;
      prefetch_lead_->Observe(static_cast<double>(lead) / 1e9);
    } else {
      ++prefetch_unused_;
    }
    prefetched_at_.erase(it);
  }

  // A removed value's bytes are zeroed before its slot is reused: clients
  // map the segment, and a removal must leave nothing of the value there.
  // (Evicted slots keep their bytes until reused.)
  void ClearAndFreeSlot(uint32_t slot) {
    std::memset(segment_->base() + alloc_.offset(slot), 0, alloc_.meta(slot).size);
    FreeSlot(slot);
  }

  void FreeSlot(uint32_t slot) {
    allocated_bytes_ -= alloc_.SlotBytes(slot);
    const bool run = alloc_.class_of(slot) == alloc_.large_class();
    alloc_.Free(slot);
    if (run) OnCapacityChange();
  }

  // REQUIRES: committed, unpinned, already out of the policy's queues.
  // may_lend: the listener may keep the slot (see EvictionListener); a slab
  // being emptied for another class frees its slots now instead.
  void EvictSlot(uint32_t slot, bool may_lend) {
    SlotMeta& m = alloc_.meta(slot);
    KVPOOL_CHECK(m.state == SlotState::kCommitted && m.pins == 0);
    bool lent = false;
    if (listener_) {
      const Lend lend = [&] {
        KVPOOL_CHECK(!lent);
        lent = true;
        return Pin(this, slot, m.key, alloc_.offset(slot), m.size);
      };
      listener_(m.key, segment_->base() + alloc_.offset(slot), m.size, may_lend ? &lend : nullptr);
    }
    NoteEvictionAge(m.key);
    KVPOOL_CHECK(index_.Erase(m.key, slot));
    DropEntry(slot);
    ++evictions_;
    evictions_metric_->Inc();
    if (!lent) {
      FreeSlot(slot);
      return;
    }
    // Out of the index, pinned by the borrower, freed (not cleared) by the
    // last Unpin, as a read-through copy's slot is.
    m.state = SlotState::kUnlisted;
    m.pins = 1;
    ++alloc_.slab(alloc_.slab_of(slot)).busy;
    ++pinned_;
    ++lent_;
  }

  // Eviction age (the time from an entry's last commit or hit to its
  // eviction) is measured on a sample: keys whose id has its low 6 bits of
  // `hi` zero, one in 64, so the map stays at about entries / 64.
  static bool AgeSampled(const KeyId& key) { return (key.hi & 63) == 0; }
  void NoteAgeUse(const KeyId& key) {
    if (AgeSampled(key)) age_last_use_[key] = time_->Now();
  }
  void NoteEvictionAge(const KeyId& key) {
    if (!AgeSampled(key)) return;
    auto it = age_last_use_.find(key);
    if (it == age_last_use_.end()) return;
    const auto age = time_->Now() - it->second;
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(age).count();
    eviction_age_->Observe(static_cast<double>(us) / 1e6);
    recent_age_us_.Add(static_cast<uint64_t>(us), 1);
  }

  // may_lend: only where the eviction makes room in the capacity and the
  // memory comes from the read room (FitCapacity); an eviction for memory
  // itself needs the slot free now.
  bool EvictFrom(uint16_t cls, bool may_lend = false) {
    ExpireLeases();
    uint32_t victim = PickDemoted(cls);
    if (victim == kNoSlot) victim = policy_->PickVictim(cls);
    if (victim == kNoSlot) victim = PickRetained(cls);
    if (victim == kNoSlot) return false;
    EvictSlot(victim, may_lend);
    return true;
  }

  // Cache hints' leases (Retain, PinFor). A leased entry is out of the
  // policy's lists: a retained one is in retained_, taken by PickRetained
  // only when the policy has nothing of its class to evict; a pinned one is
  // in neither and keeps its slab busy, so nothing evicts or moves it.
  struct Lease {
    uint64_t expiry_ns;
    uint8_t priority;
    uint64_t batch;  // the hint that set it (retain_batches_)
    uint32_t pos;    // its key's place in that hint
  };
  // Retained entries in the order they go: the lowest priority first; then
  // the least recently retained (the retained entries are an LRU of their
  // own: retaining again refreshes); within one hint, the last key first,
  // so a chain retained head first goes from its tail.
  using RetainedOrder = std::tuple<uint16_t, uint8_t, uint64_t, uint32_t, uint32_t>;
  static RetainedOrder OrderOf(uint16_t cls, const Lease& l, uint32_t slot) {
    return {cls, l.priority, l.batch, UINT32_MAX - l.pos, slot};
  }
  // Demoted entries go first in their class, the first demoted first.
  using DemotedOrder = std::tuple<uint16_t, uint64_t, uint32_t, uint32_t>;
  static DemotedOrder DemotedOrderOf(uint16_t cls, const Lease& l, uint32_t slot) {
    return {cls, l.batch, l.pos, slot};
  }
  // The same order over every class (the bound on retained bytes).
  using GlobalOrder = std::tuple<uint8_t, uint64_t, uint32_t, uint32_t>;
  static GlobalOrder GlobalOrderOf(const Lease& l, uint32_t slot) {
    return {l.priority, l.batch, UINT32_MAX - l.pos, slot};
  }

  // REQUIRES: mu_ held. fn(slot) for each key in DRAM, in order; the
  // others are counted unknown.
  template <typename F>
  HintResult ForEachFound(std::span<const KeyId> keys, F fn) {
    HintResult r;
    for (const KeyId& key : keys) {
      const uint32_t slot = Find(key);
      if (slot == kNoSlot) {
        ++r.unknown;
        continue;
      }
      ++r.applied;
      fn(slot);
    }
    return r;
  }

  Status CheckHintKeys(size_t keys) const {
    if (keys > hint_max_keys_) {
      return InvalidArgument("dram: a hint names " + std::to_string(keys) +
                             " keys, more than the most of " + std::to_string(hint_max_keys_));
    }
    return Status::Ok();
  }

  Status CheckHint(size_t keys, std::chrono::nanoseconds ttl) const {
    KVPOOL_RETURN_IF_ERROR(CheckHintKeys(keys));
    if (ttl <= std::chrono::nanoseconds::zero() || ttl > hint_max_ttl_) {
      return InvalidArgument("dram: a hint's ttl must be in (0, " +
                             std::to_string(hint_max_ttl_.count() / 1'000'000'000) + " s]");
    }
    return Status::Ok();
  }

  uint64_t NowNs() const {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(time_->Now().time_since_epoch())
            .count());
  }

  // REQUIRES: mu_ held. The leases set from here on are one hint's.
  void NewLeaseBatch() {
    ++retain_batches_;
    lease_pos_ = 0;
  }

  // REQUIRES: mu_ held; slot committed and in no order.
  void AddLease(uint32_t slot, uint16_t cls, uint8_t kind, uint64_t expiry_ns, uint8_t priority) {
    SlotMeta& m = alloc_.meta(slot);
    m.hint = kind;
    const Lease l{expiry_ns, priority, retain_batches_, lease_pos_++};
    leases_[slot] = l;
    if (kind == kHintDemoted) {
      demoted_.insert(DemotedOrderOf(cls, l, slot));
      return;
    }
    expiries_.insert({expiry_ns, slot});
    if (kind == kHintRetained) {
      retained_.insert(OrderOf(cls, l, slot));
      retained_all_.insert(GlobalOrderOf(l, slot));
      retained_bytes_ += m.size;
    } else {
      ++alloc_.slab(alloc_.slab_of(slot)).busy;
      hint_pinned_bytes_ += m.size;
    }
  }

  // REQUIRES: mu_ held; slot leased. Leaves it in no order.
  void DropLease(uint32_t slot, uint16_t cls) {
    SlotMeta& m = alloc_.meta(slot);
    auto it = leases_.find(slot);
    KVPOOL_CHECK(it != leases_.end());
    const Lease l = it->second;
    leases_.erase(it);
    if (m.hint == kHintDemoted) {
      KVPOOL_CHECK(demoted_.erase(DemotedOrderOf(cls, l, slot)) == 1);
      m.hint = kHintNone;
      return;
    }
    expiries_.erase({l.expiry_ns, slot});
    if (m.hint == kHintRetained) {
      KVPOOL_CHECK(retained_.erase(OrderOf(cls, l, slot)) == 1);
      KVPOOL_CHECK(retained_all_.erase(GlobalOrderOf(l, slot)) == 1);
      retained_bytes_ -= m.size;
    } else {
      --alloc_.slab(alloc_.slab_of(slot)).busy;
      hint_pinned_bytes_ -= m.size;
    }
    m.hint = kHintNone;
  }

  // REQUIRES: mu_ held. A lease ends: the entry returns to the policy's
  // order as if just written.
  void EndLease(uint32_t slot) {
    const uint16_t cls = alloc_.class_of(slot);
    DropLease(slot, cls);
    policy_->Insert(slot, cls);
  }

  // REQUIRES: mu_ held. Ends the leases whose time has come.
  void ExpireLeases() {
    if (expiries_.empty()) return;
    const uint64_t now = NowNs();
    while (!expiries_.empty() && expiries_.begin()->first <= now) {
      EndLease(expiries_.begin()->second);
      ++leases_expired_;
    }
  }

  // REQUIRES: mu_ held. The first entry of cls in a lease order (a set of
  // tuples led by the class and ended by the slot) that no reader has
  // pinned, taken out of the lease order; kNoSlot when there is none.
  template <typename Order>
  uint32_t PickLeased(const std::set<Order>& order, uint16_t cls) {
    Order from{};
    std::get<0>(from) = cls;
    for (auto it = order.lower_bound(from); it != order.end() && std::get<0>(*it) == cls; ++it) {
      const uint32_t slot = std::get<std::tuple_size_v<Order> - 1>(*it);
      if (alloc_.meta(slot).pins > 0) continue;
      DropLease(slot, cls);
      return slot;
    }
    return kNoSlot;
  }
  // The retained entry of cls to evict first (RetainedOrder).
  uint32_t PickRetained(uint16_t cls) { return PickLeased(retained_, cls); }
  // The demoted entry of cls to evict first: the first demoted.
  uint32_t PickDemoted(uint16_t cls) { return PickLeased(demoted_, cls); }

  // REQUIRES: mu_ held. Takes slot out of whichever order holds it: the
  // policy's, or a lease's.
  void OrderErase(uint32_t slot, uint16_t cls) {
    if (alloc_.meta(slot).hint == kHintNone) {
      policy_->Erase(slot, cls);
    } else {
      DropLease(slot, cls);
    }
  }

  // A commit or hit of `bytes` in `slot`: advances the clock, marks the slab
  // most recently used in its class, and counts a hit as reads of the class.
  void NoteUse(uint32_t slot, uint16_t cls, uint64_t bytes, bool hit) {
    clock_ += bytes;
    alloc_.TouchSlab(alloc_.slab_of(slot), clock_);
    if (hit) {
      alloc_.Restamp(slot, clock_);
      read_bytes_[cls] += bytes;
    } else {
      alloc_.StampIn(slot, clock_);
    }
    since_decay_ += bytes;
    if (since_decay_ >= decay_bytes_) {
      for (uint64_t& r : read_bytes_) r >>= 1;
      since_decay_ = 0;
    }
  }

  // Recent bytes read per slab; infinite for a class without slabs.
  double ReadDensity(uint16_t cls) const {
    const uint64_t slabs = alloc_.class_slabs(cls);
    return slabs == 0 ? std::numeric_limits<double>::infinity()
                      : static_cast<double>(read_bytes_[cls]) / static_cast<double>(slabs);
  }

  // Age of the entries class cls evicts next, estimated as twice its
  // entries' mean age (their ages spread evenly from 0 to the eviction age
  // when nothing is read, the one case this is used in). 0 without entries.
  uint64_t EvictionAge(uint16_t cls) const { return 2 * alloc_.ClassMeanAge(cls, clock_); }

  // Whether class `donor` may give its slab i to class `needy`, whose read
  // density and eviction age are given (see the top of the file). A slab
  // without entries is as old as its last touch.
  bool MayDonate(uint16_t donor, uint32_t i, double needy_reads, uint64_t needy_age) const {
    const double donor_reads = ReadDensity(donor);
    if (donor_reads * 2 < needy_reads) return true;
    if (donor_reads != 0 || needy_reads != 0) return false;
    const uint64_t donor_age = alloc_.slab(i).stamped == 0 ? clock_ - alloc_.slab(i).last_used
                                                           : alloc_.SlabMeanAge(i, clock_);
    return donor_age > needy_age && donor_age - needy_age > needy_age / 2;
  }

  // Reclaims a slab of another class for `needy` and returns it unassigned,
  // or kNoSlab. Per class, the candidate is its least recently used
  // reclaimable slab among the few oldest. Without any_donor: the candidate
  // of the least read class that may donate (MayDonate), the oldest on a
  // tie; with any_donor: the oldest candidate of any class.
  uint32_t TakeSlab(uint16_t needy, bool any_donor) {
    if (!any_donor && alloc_.class_slabs(needy) == alloc_.assigned_slabs()) return kNoSlab;
    constexpr uint32_t kWalk = 4;
    const uint32_t walk = any_donor ? std::numeric_limits<uint32_t>::max() : kWalk;
    const double needy_reads = ReadDensity(needy);
    const uint64_t needy_age = EvictionAge(needy);
    uint32_t best = kNoSlab;
    double best_reads = 0;
    for (uint16_t c = 0; c < alloc_.num_classes(); ++c) {
      if (c == needy) continue;
      uint32_t i = alloc_.oldest_slab(c);
      for (uint32_t k = 0; i != kNoSlab && k < walk && alloc_.slab(i).busy != 0; ++k) {
        i = alloc_.slab(i).next;
      }
      if (i == kNoSlab || alloc_.slab(i).busy != 0) continue;
      const Slab& s = alloc_.slab(i);
      const double reads = any_donor ? 0 : ReadDensity(c);
      if (!any_donor && !MayDonate(c, i, needy_reads, needy_age)) continue;
      if (best == kNoSlab || reads < best_reads ||
          (reads == best_reads && s.last_used < alloc_.slab(best).last_used)) {
        best = i;
        best_reads = reads;
      }
    }
    if (best == kNoSlab) return kNoSlab;
    ReclaimSlab(best);
    ++slab_moves_;
    slab_moves_metric_->Inc();
    return best;
  }

  // Entries the store holds when full at the current mix: slots of the
  // assigned slabs (runs count one), scaled to all slabs.
  uint64_t CapacityEntries() const {
    const uint64_t assigned = alloc_.assigned_slabs();
    return assigned == 0 ? 0 : alloc_.total_slots() * cache_slabs_ / assigned;
  }

  uint64_t IndexBytes() const {
    return index_.bytes() + alloc_.metadata_bytes() + policy_->bytes() +
           read_bytes_.capacity() * sizeof(uint64_t) +
           age_last_use_.bucket_count() * sizeof(void*) +
           age_last_use_.size() * (sizeof(KeyId) + sizeof(Clock::time_point) + 2 * sizeof(void*));
  }

  void OnCapacityChange() {
    policy_->SetCapacityEntries(CapacityEntries());
  }

  Result<uint32_t> AllocateSlot(uint16_t cls) {
    for (;;) {
      const uint32_t slot = alloc_.PopFree(cls);
      if (slot != kNoSlot) return slot;
      uint32_t slab = alloc_.FindFreeSlab();
      if (slab == kNoSlab) slab = TakeSlab(cls, /*any_donor=*/false);
      if (slab == kNoSlab && EvictFrom(cls)) continue;
      if (slab == kNoSlab) slab = TakeSlab(cls, /*any_donor=*/true);
      if (slab == kNoSlab) return ResourceExhausted("dram: every slot is pinned or reserved");
      alloc_.AssignSlab(slab, cls);
      alloc_.TouchSlab(slab, clock_);  // not a candidate before its first commit
      OnCapacityChange();
    }
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
      OrderErase(slot, cls);
      EvictSlot(slot, /*may_lend=*/false);  // frees the run
      return;
    }
    for (uint32_t k = 0; k < alloc_.slots_per_slab(cls); ++k) {
      const uint32_t slot = alloc_.SlotId(i, k);
      if (alloc_.meta(slot).state != SlotState::kCommitted) continue;
      OrderErase(slot, cls);
      EvictSlot(slot, /*may_lend=*/false);
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
        alloc_.TouchSlab(first, clock_);
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
  // and reclaimable slabs of classes that may donate to the large class
  // (MayDonate), or of any class. Cost: entries to evict. False when no
  // window qualifies.
  bool ReclaimWindow(uint32_t n, bool any_donor) {
    const uint16_t large = alloc_.large_class();
    const double large_reads = ReadDensity(large);
    const uint64_t large_age = EvictionAge(large);
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
        cost[i] = (any_donor || MayDonate(h.cls, head, large_reads, large_age)) ? 1 + h.used : -1;
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
    gauge("kvpool_dram_capacity_bytes",
          "Bytes of slots committed entries may take (the segment is this plus the read room).",
          [this] { return cache_bytes_; });
    gauge("kvpool_dram_read_room_bytes",
          "Bytes of the segment beyond the capacity, for values in flight (--dram-read-room).",
          [this] { return segment_->bytes() - cache_bytes_; });
    gauge("kvpool_dram_huge_page_bytes",
          "Bytes of the segment on 2 MiB pages at start: hugetlb pages, or transparent huge pages "
          "for shared memory (0: 4 KiB pages throughout).",
          [this] { return segment_->huge_page_bytes(); });
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
    eviction_age_ = metrics_->GetHistogram(
        "kvpool_dram_eviction_age_seconds",
        "Time from an evicted entry's last commit or hit to its eviction (one key in 64)", {},
        Histogram::ExponentialBounds(0.01, 2, 22));
    prefetch_lead_ =
        metrics_->GetHistogram("kvpool_dram_prefetch_lead_seconds",
                               "Time from a prefetch bringing an entry into DRAM to its first read",
                               {}, Histogram::ExponentialBounds(0.001, 2, 20));
    if (policy_->adaptation().adaptive) RegisterAdaptationMetrics();
    for (const RecentWindow& rw : kRecentWindows) {
      metrics_->AddCallbackGauge(
          "kvpool_dram_eviction_age_recent_seconds",
          "Mean eviction age (kvpool_dram_eviction_age_seconds) over a recent window",
          {{"window", rw.label}},
          [this, s = rw.seconds] { return recent_age_us_.Ratio(s) / 1e6; }, this);
    }
  }

  // What the eviction policy adapts (EvictionPolicy::adaptation).
  void RegisterAdaptationMetrics() {
    auto gauge = [this](const char* name, const char* help, Labels labels, auto fn) {
      metrics_->AddCallbackGauge(
          name, help, std::move(labels),
          [this, fn] {
            std::lock_guard lock(mu_);
            return static_cast<double>(fn(policy_->adaptation()));
          },
          this);
    };
    gauge("kvpool_dram_eviction_protected_share",
          "The prefix policy's protected list, as a share of each size class's slots, as its "
          "shadow caches chose it.",
          {}, [](const EvictionAdaptation& a) { return a.protected_share; });
    gauge("kvpool_dram_eviction_bimodal",
          "1 when the share the shadow caches chose inserts bimodally (an entry bound for a "
          "list's warm end enters its cold end, but for one in 32), else 0.",
          {}, [](const EvictionAdaptation& a) { return a.bimodal ? 1.0 : 0.0; });
    const EvictionAdaptation a = policy_->adaptation();
    for (size_t i = 0; i < a.candidate_shares.size(); ++i) {
      gauge("kvpool_dram_eviction_shadow_hit_ratio",
            "Hit ratio of the shadow cache that runs the prefix policy at this protected share "
            "and insertion (warm, or bimodal) over sampled keys (recent accesses, decayed every "
            "window).",
            {{"share", fmt::format("{:.1f}", a.candidate_shares[i])},
             {"insert", a.candidate_bimodal[i] ? "bimodal" : "warm"}},
            [i](const EvictionAdaptation& x) { return x.shadow_hit_ratios[i]; });
    }
    gauge("kvpool_dram_eviction_share_changes",
          "Times the shadow caches changed the protected share since the store opened.", {},
          [](const EvictionAdaptation& x) { return x.share_changes; });
    gauge("kvpool_dram_eviction_shadow_sample_rate", "Fraction of keys the shadow caches follow.",
          {}, [](const EvictionAdaptation& x) { return x.sample_rate; });
    gauge("kvpool_dram_eviction_shadow_keys", "Keys the shadow caches hold.", {},
          [](const EvictionAdaptation& x) { return x.shadow_keys; });
  }

  const std::unique_ptr<Segment> segment_;
  const uint64_t max_value_bytes_;
  const std::unique_ptr<MetricsRegistry> owned_metrics_;  // when none was given
  MetricsRegistry* const metrics_;
  const uint64_t decay_bytes_;  // read_bytes_ halve after this much traffic
  const uint64_t cache_bytes_;  // DramOptions::capacity_bytes
  const uint64_t cache_slabs_;  // cache_bytes_ in slabs
  const uint64_t cache_share_;  // cache_slabs_ in SlabShare units
  const bool has_read_room_;    // DramOptions::read_room_bytes > 0
  Counter* evictions_metric_ = nullptr;
  Counter* slab_moves_metric_ = nullptr;
  Counter* hits_ = nullptr;
  Counter* misses_ = nullptr;
  Histogram* eviction_age_ = nullptr;
  Histogram* prefetch_lead_ = nullptr;
  const Clock* const time_;    // eviction ages, leases
  RecentRatio recent_age_us_;  // microseconds of sampled eviction ages, per eviction
  const uint64_t pin_max_bytes_;                 // DramOptions::pin_max_bytes
  const std::chrono::nanoseconds hint_max_ttl_;  // DramOptions::hint_max_ttl
  const uint64_t hint_max_keys_;                 // DramOptions::hint_max_keys
  const uint64_t retain_max_bytes_;              // DramOptions::retain_max_percent of the capacity

  mutable std::mutex mu_;
  // Everything below is protected by mu_.
  SlabAllocator alloc_;
  SlotIndex index_;
  // Set once. Its TouchChainsHeadLast() (commits keep their chain place)
  // is fixed, read with or without mu_.
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<uint64_t> read_bytes_;     // per class: bytes hit, decayed
  uint64_t since_decay_ = 0;             // bytes committed and hit since the last halving
  uint64_t clock_ = 0;                   // bytes committed and hit: stamps slabs (NoteUse)
  EvictionListener listener_;
  uint64_t used_bytes_ = 0;
  // SlabShare of the committed entries and of the reservations not made
  // for a read: kept within cache_share_ (FitCapacity).
  uint64_t counted_share_ = 0;
  uint64_t allocated_bytes_ = 0;
  uint64_t entries_ = 0;
  uint64_t reserved_ = 0;
  uint64_t pinned_ = 0;
  uint64_t lent_ = 0;  // evictions whose slot the listener kept
  uint64_t evictions_ = 0;
  uint64_t slab_moves_ = 0;
  mutable uint64_t lookup_rounds_ = 0;
  // Cache hints' leases: by slot; by expiry; retained entries in their
  // eviction order (RetainedOrder).
  std::unordered_map<uint32_t, Lease> leases_;
  std::set<std::pair<uint64_t, uint32_t>> expiries_;
  std::set<RetainedOrder> retained_;
  std::set<GlobalOrder> retained_all_;
  uint64_t retain_batches_ = 0;  // hints that set leases
  uint32_t lease_pos_ = 0;       // leases the current one has set
  uint64_t retains_clipped_ = 0;
  uint64_t retained_bytes_ = 0;
  uint64_t hint_pinned_bytes_ = 0;
  uint64_t leases_expired_ = 0;
  std::set<DemotedOrder> demoted_;
  // Prefetched entries not read yet: when they were marked.
  std::unordered_map<uint32_t, uint64_t> prefetched_at_;
  uint64_t prefetch_hits_ = 0;
  uint64_t prefetch_unused_ = 0;
  uint64_t prefetch_lead_ns_ = 0;  // summed over prefetch_hits_
  std::unordered_map<KeyId, Clock::time_point, KeyIdHash> age_last_use_;  // sampled keys
};

}  // namespace
}  // namespace dram

const char* HintOpName(HintOp op) {
  switch (op) {
    case HintOp::kRetain:
      return "retain";
    case HintOp::kPin:
      return "pin";
    case HintOp::kPrefetch:
      return "prefetch";
    case HintOp::kDemote:
      return "demote";
    case HintOp::kRelease:
      return "release";
  }
  return nullptr;
}

std::optional<HintOp> HintOpOf(uint32_t wire) {
  if (wire < static_cast<uint32_t>(HintOp::kRetain) ||
      wire > static_cast<uint32_t>(HintOp::kRelease)) {
    return std::nullopt;
  }
  return static_cast<HintOp>(wire);
}

Result<std::unique_ptr<DramStore>> DramStore::Open(const DramOptions& options,
                                                   MetricsRegistry* metrics) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  dram::SegmentOptions so;
  so.bytes = options.capacity_bytes + options.read_room_bytes;
  so.huge_pages = options.huge_pages;
  so.prefault = options.prefault;
  so.seal_writes = options.seal_client_writes;
  KVPOOL_ASSIGN_OR_RETURN(auto segment, dram::Segment::Create(so));
  return std::unique_ptr<DramStore>(
      new dram::DramStoreImpl(options, std::move(segment), metrics));
}

}  // namespace kvpool
