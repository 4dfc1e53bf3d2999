#include "store/tiered_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/check.h"
#include "common/log.h"
#include "store/dram/frequency_sketch.h"

namespace kvpool {

Status TieringOptions::Validate() const {
  if (admit_min_reads > 15) return InvalidArgument("admit_min_reads must be in 0..15");
  return Status::Ok();
}

const char* HoldingsWhyName(HoldingsEvent::Why why) {
  using W = HoldingsEvent::Why;
  switch (why) {
    case W::kWritten: return "written";
    case W::kPromoted: return "promoted";
    case W::kMovedToSsd: return "moved_to_ssd";
    case W::kEvicted: return "evicted";
    case W::kRemoved: return "removed";
    case W::kHandedOff: return "handed_off";
    case W::kLost: return "lost";
  }
  return "unknown";
}

namespace {

// Reads per key lately, for SSD admission: the frequency sketch the
// tinylfu eviction policy keeps (4-bit counters, halved every 4 M reads so
// old popularity fades), behind a lock of its own, since reads are counted
// from any thread. Bounded memory, no per-key state.
class ReadCounts {
 public:
  void Increment(const KeyId& k) {
    std::lock_guard lock(mu_);
    sketch_.Increment(k);
  }
  uint32_t Estimate(const KeyId& k) const {
    std::lock_guard lock(mu_);
    return sketch_.Estimate(k);
  }

 private:
  mutable std::mutex mu_;
  dram::FrequencySketch sketch_{1 << 20, 1 << 22};  // protected by mu_
};

}  // namespace

struct TieredStore::Impl {
  TieredStore* self;
  Executor* executor;
  TieringOptions options;
  ReadCounts sketch;
  std::mutex mu;
  // Promotions in flight: later callers for the same key wait on the first.
  std::unordered_map<KeyId, std::vector<PromoteDone>, KeyIdHash> inflight;  // mu

  Counter* promotions;
  Counter* promotion_failures;
  Counter* promotion_shared;
  Counter* demotions;
  Counter* demotions_skipped;
  Counter* demotions_dropped;

  // The holdings stream's observers, one per HoldingsSlot (see Emit), and
  // the calls of them running now (an observer may cause events itself: no
  // lock is held).
  std::array<std::atomic<HoldingsObserver*>, kHoldingsSlots> observers{};
  std::atomic<uint64_t> observer_calls{0};
  std::atomic<bool> ssd_open{false};  // demotions go to the SSD tier
  LendTerms lend_terms;               // for demotions in place (TieringOptions)

  bool observed() const {
    for (const auto& o : observers) {
      if (o.load(std::memory_order_relaxed) != nullptr) return true;
    }
    return false;
  }

  // Every holdings event passes through here.
  void Emit(const HoldingsEvent& e) {
    if (!observed()) return;
    observer_calls.fetch_add(1);  // before the loads: see SetHoldingsObserver
    for (auto& slot : observers) {
      if (HoldingsObserver* o = slot.load()) o->OnHoldings(e);
    }
    observer_calls.fetch_sub(1);
  }
  void EmitStored(HoldingsEvent::Why why, WriteOrigin origin, const KeyId& key, uint64_t size) {
    Emit({HoldingsEvent::Kind::kStored, why, HoldingTier::kDram, origin, false, key, size});
  }
  void EmitDropped(HoldingsEvent::Why why, HoldingTier tier, bool still_held, const KeyId& key,
                   uint64_t size) {
    Emit({HoldingsEvent::Kind::kDropped, why, tier, WriteOrigin::kPut, still_held, key, size});
  }

  // The DRAM tier's eviction listener, under its lock: the entry is written
  // back to SSD when the SSD tier admits it.
  void OnDramEviction(const KeyId& key, const uint8_t* data, uint64_t size,
                      const DramStore::Lend* lend) {
    using W = HoldingsEvent::Why;
    SsdStore* ssd = ssd_open.load(std::memory_order_acquire) ? self->ssd_ : nullptr;
    if (ssd == nullptr) {
      EmitDropped(W::kEvicted, HoldingTier::kDram, false, key, size);
      return;
    }
    if (options.admit_min_reads > 0 && sketch.Estimate(key) < options.admit_min_reads) {
      demotions_skipped->Inc();
      // Still held when an earlier demotion (before a promotion) wrote it.
      if (observed()) {
        const bool held = ssd->Contains(key);
        EmitDropped(held ? W::kMovedToSsd : W::kEvicted, HoldingTier::kDram, held, key, size);
      }
      return;
    }
    // In place where it can (InsertLent also tells of a key written back
    // earlier); else the copy, under the DRAM lock, which never waits for a
    // region write here (Reserve waited for room before taking the lock).
    LendResult lent = LendResult::kRefused;
    if (lend != nullptr && options.demote_in_place) {
      lent = ssd->InsertLent(key, data, size, lend_terms,
                             [lend] { return std::make_shared<DramStore::Pin>((*lend)()); });
      if (lent == LendResult::kLent) demotions->Inc();
    }
    bool held = lent != LendResult::kRefused || ssd->Contains(key);
    if (!held) {
      held = ssd->TryInsert(key, data, size);
      if (held) demotions->Inc();
      else demotions_dropped->Inc();
    }
    EmitDropped(held ? W::kMovedToSsd : W::kEvicted, HoldingTier::kDram, held, key, size);
  }

  // Entries the SSD tier dropped by itself (region reclaimed): still held
  // when DRAM has them.
  void OnSsdDrops(const std::vector<SsdEntry>& gone) {
    for (const SsdEntry& e : gone) {
      EmitDropped(HoldingsEvent::Why::kEvicted, HoldingTier::kSsd, self->dram_->Contains(e.key),
                  e.key, e.size);
    }
  }

  void RunPromotion(const KeyId& key) {
    bool read = false;
    auto pinned = ReadIntoDram(key, &read);
    std::vector<PromoteDone> waiters;
    {
      std::lock_guard lock(mu);
      auto it = inflight.find(key);
      if (it != inflight.end()) {
        waiters = std::move(it->second);
        inflight.erase(it);
      }
    }
    if (!pinned.ok()) {
      promotion_failures->Inc();
      // A record that did not verify is dropped from the SSD tier.
      if (pinned.status().code() == StatusCode::kCorruption && !self->Contains(key)) {
        EmitDropped(HoldingsEvent::Why::kLost, HoldingTier::kSsd, false, key, 0);
      }
      for (auto& w : waiters) w(pinned.status(), DramStore::Pin());
      return;
    }
    if (read) {
      promotions->Inc();
      EmitStored(HoldingsEvent::Why::kPromoted, WriteOrigin::kPut, key, pinned->size());
    }
    // The first pin keeps the entry in place while the other waiters pin it.
    for (size_t i = 1; i < waiters.size(); ++i) {
      auto pin = self->dram_->Acquire(key);
      if (pin.ok()) waiters[i](Status::Ok(), std::move(pin).value());
      else waiters[i](pin.status(), DramStore::Pin());
    }
    if (!waiters.empty()) waiters[0](Status::Ok(), std::move(pinned).value());
  }

  // Brings the key into DRAM and pins it. *read tells whether the bytes came
  // from SSD (false when another writer or promotion had put it in DRAM).
  Result<DramStore::Pin> ReadIntoDram(const KeyId& key, bool* read) {
    auto resident = self->dram_->Acquire(key);
    if (resident.ok()) return resident;
    SsdStore* ssd = self->ssd_;
    KVPOOL_ASSIGN_OR_RETURN(uint64_t size, ssd->Lookup(key));
    ssd->WaitForRoom(size);  // for what this Reserve evicts (see Reserve)
    auto r = self->dram_->Reserve(key, size);
    if (!r.ok()) {
      // Someone put or promoted it meanwhile: pin that entry.
      if (r.status().code() == StatusCode::kAlreadyExists) return self->dram_->Acquire(key);
      return std::move(r).TakeStatus();
    }
    KVPOOL_RETURN_IF_ERROR(ssd->Read(key, r->data(), size));  // the reservation aborts on failure
    *read = true;
    return self->dram_->CommitAndAcquire(std::move(r).value());
  }
};

Result<std::unique_ptr<TieredStore>> TieredStore::Open(const DramOptions& dram,
                                                       const SsdOptions* ssd,
                                                       Executor* promote_executor,
                                                       Executor* flush_executor,
                                                       const TieringOptions& options,
                                                       MetricsRegistry* metrics) {
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<DramStore> d, DramStore::Open(dram, metrics));
  std::unique_ptr<SsdStore> s;
  if (ssd != nullptr) {
    SsdOptions so = *ssd;
    so.max_value_bytes = d->max_value_bytes();
    KVPOOL_ASSIGN_OR_RETURN(s, SsdStore::Open(so, metrics, flush_executor));
  }
  auto store = std::make_unique<TieredStore>(d.get(), s.get(), promote_executor, options, metrics);
  store->owned_dram_ = std::move(d);
  store->owned_ssd_ = std::move(s);
  return store;
}

LendTerms LendTermsFor(const DramStats& ds, uint64_t segment_bytes) {
  LendTerms t;
  // A lent slot's memory comes from the read room (DramStore::Lend): half
  // of it at most, the rest left to the reads it is for.
  t.max_lent_bytes = ds.read_room_bytes / 2;
  // Region writes gather straight from the slots where the segment is on
  // 2 MiB pages, hugetlb or transparent (9/10 of it at least: the kernel
  // may have found no huge page for a few ranges). From 4 KiB pages an
  // O_DIRECT write runs at a fraction of the device's rate
  // (docs/architecture.md, "Life of an SSD promotion").
  t.gather = ds.huge_pages || ds.huge_page_bytes >= segment_bytes / 10 * 9;
  // A gathered slot stays lent until its region is written, where one lent
  // for a copy goes back within a flush thread's job. Half the budget is
  // kept for those: with all of it gathered, the lending stops while the
  // buffers fill, and the evictions copy under the DRAM lock instead.
  t.max_gathered_bytes = t.max_lent_bytes / 2;
  return t;
}

TieredStore::TieredStore(DramStore* dram, SsdStore* ssd, Executor* executor,
                         const TieringOptions& options, MetricsRegistry* metrics)
    : impl_(std::make_unique<Impl>()), dram_(dram), ssd_(ssd) {
  impl_->self = this;
  impl_->executor = executor;
  impl_->options = options;
  impl_->promotions = metrics->GetCounter("kvpool_tier_promotions_total",
                                          "Entries read from SSD into DRAM on a DRAM miss");
  impl_->promotion_failures = metrics->GetCounter(
      "kvpool_tier_promotion_failures_total",
      "Promotions that failed (record gone, did not verify, I/O error, no DRAM space)");
  impl_->promotion_shared = metrics->GetCounter(
      "kvpool_tier_promotions_shared_total", "Gets that waited on a promotion already in flight");
  impl_->demotions = metrics->GetCounter("kvpool_tier_demotions_total",
                                         "DRAM evictions written back to SSD");
  impl_->demotions_skipped = metrics->GetCounter(
      "kvpool_tier_demotions_skipped_total", "DRAM evictions not admitted to SSD (read too rarely)");
  impl_->demotions_dropped = metrics->GetCounter(
      "kvpool_tier_demotions_dropped_total",
      "DRAM evictions the SSD tier refused (buffers full, offline, disk full)");
  impl_->ssd_open.store(ssd_ != nullptr);
  const DramStats ds = dram_->GetStats();
  impl_->lend_terms = LendTermsFor(ds, dram_->segment_bytes());
  SetDemotionListener();
}

void TieredStore::SetDemotionListener() {
  Impl* impl = impl_.get();
  dram_->SetEvictionListener(
      [impl](const KeyId& key, const uint8_t* data, uint64_t size, const DramStore::Lend* lend) {
        impl->OnDramEviction(key, data, size, lend);
      });
}

TieredStore::~TieredStore() {
  for (size_t i = 0; i < kHoldingsSlots; ++i) {
    SetHoldingsObserver(nullptr, static_cast<HoldingsSlot>(i));
  }
  dram_->SetEvictionListener(nullptr);
}

Status TieredStore::Commit(Reservation reservation, WriteOrigin origin, Chain* chain,
                           bool returning) {
  const KeyId key = reservation.key();
  const uint64_t size = reservation.size();
  Status s = dram_->Commit(std::move(reservation), chain, returning);
  if (s.ok()) impl_->EmitStored(HoldingsEvent::Why::kWritten, origin, key, size);
  return s;
}

Result<TieredStore::Pin> TieredStore::CommitAndAcquire(Reservation reservation,
                                                       WriteOrigin origin) {
  const KeyId key = reservation.key();
  const uint64_t size = reservation.size();
  const uint64_t offset = reservation.offset();
  auto pin = dram_->CommitAndAcquire(std::move(reservation), origin == WriteOrigin::kCopy);
  // When another writer committed the key first, its entry is pinned
  // instead: in another slot, as the reserved one was taken until now.
  if (pin.ok() && pin->offset() == offset) {
    impl_->EmitStored(HoldingsEvent::Why::kWritten, origin, key, size);
  }
  return pin;
}

Result<TieredStore::Pin> TieredStore::PinUncommitted(Reservation reservation) {
  return dram_->PinUncommitted(std::move(reservation));
}

void TieredStore::SetHoldingsObserver(HoldingsObserver* observer, HoldingsSlot slot) {
  impl_->observers[static_cast<size_t>(slot)].store(observer);
  if (ssd_ != nullptr && !impl_->observed()) ssd_->SetDropListener(nullptr);
  // A call that loaded the previous observer counted itself first (both
  // sequentially consistent): wait for those calls to end.
  while (impl_->observer_calls.load() != 0) std::this_thread::yield();
  if (ssd_ != nullptr && observer != nullptr) {
    Impl* impl = impl_.get();
    ssd_->SetDropListener([impl](const std::vector<SsdEntry>& gone) { impl->OnSsdDrops(gone); });
  }
}

Result<TieredStore::Reservation> TieredStore::Reserve(const KeyId& key, uint64_t size) {
  KVPOOL_RETURN_IF_ERROR(BeforeReserve(key, size));
  return dram_->Reserve(key, size);
}

Result<TieredStore::Reservation> TieredStore::ReserveForRead(const KeyId& key, uint64_t size) {
  KVPOOL_RETURN_IF_ERROR(BeforeReserve(key, size));
  return dram_->ReserveForRead(key, size);
}

Status TieredStore::BeforeReserve(const KeyId& key, uint64_t size) {
  if (ssd_ != nullptr) {
    if (ssd_->Contains(key)) return AlreadyExists("key is stored (on SSD)");
    // The Reserve may evict, and evictions are demoted under the DRAM lock
    // without waiting: when the SSD tier's buffers are all being written,
    // wait for one here, outside that lock (bounded by --ssd-insert-wait),
    // so puts run at the device's speed and other requests keep going.
    // On timeout the put goes on and its evictions may be dropped.
    ssd_->WaitForRoom(size);
  }
  return Status::Ok();
}

Result<TieredStore::Pin> TieredStore::Acquire(const KeyId& key) {
  auto p = dram_->Acquire(key);
  if (p.ok() && ssd_ != nullptr && impl_->options.admit_min_reads > 0) impl_->sketch.Increment(key);
  return p;
}

void TieredStore::CountRead(const KeyId& key) {
  if (ssd_ != nullptr && impl_->options.admit_min_reads > 0) impl_->sketch.Increment(key);
}

size_t TieredStore::PinHeld(std::span<const KeyId> keys, std::span<Pin> pins, uint8_t* run) {
  const bool counted = ssd_ != nullptr && impl_->options.admit_min_reads > 0;
  std::vector<bool> had;
  if (counted) {
    had.resize(pins.size());
    for (size_t i = 0; i < pins.size(); ++i) had[i] = pins[i].valid();
  }
  const size_t pinned = dram_->AcquireBatch(keys, pins, run);
  if (counted) {
    for (size_t i = 0; i < pins.size(); ++i) {
      if (!had[i] && pins[i].valid()) impl_->sketch.Increment(keys[i]);
    }
  }
  return pinned;
}

void TieredStore::ReadBatch(std::span<const KeyId> keys, BatchRead* out, const Promoted& promoted) {
  out->pins.clear();
  out->pins.resize(keys.size());
  out->cold.clear();
  out->absent.clear();
  out->run = UINT8_MAX;
  if (PinHeld(keys, out->pins, &out->run) == keys.size()) return;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    if (out->pins[i].valid()) continue;
    if (ssd_ == nullptr || !ssd_->Contains(keys[i])) {
      out->absent.push_back(i);
      continue;
    }
    out->cold.push_back(i);
    if (!promoted) continue;
    // Promote pins the key wherever it lies by then (promoted meanwhile, or
    // still only on SSD); its pin is a read of the request's.
    Impl* impl = impl_.get();
    Promote(keys[i], [impl, promoted, i](Status, Pin pin) {
      if (pin.valid()) impl->self->CountRead(pin.key());
      promoted(i, std::move(pin));
    });
  }
}

bool TieredStore::Contains(const KeyId& key) const {
  return dram_->Contains(key) || (ssd_ != nullptr && ssd_->Contains(key));
}

Result<uint64_t> TieredStore::SizeOf(const KeyId& key) {
  if (auto pin = dram_->Acquire(key); pin.ok()) return pin->size();
  if (ssd_ != nullptr) return ssd_->Lookup(key);
  return NotFound("not held");
}

std::optional<HoldingTier> TieredStore::Where(const KeyId& key) const {
  if (dram_->Contains(key)) return HoldingTier::kDram;
  if (ssd_ != nullptr && ssd_->Contains(key)) return HoldingTier::kSsd;
  return std::nullopt;
}

Status TieredStore::Remove(const KeyId& key, HoldingsEvent::Why why) {
  uint64_t dram_size = 0;
  Status d = dram_->Remove(key, &dram_size);
  uint64_t ssd_size = 0;
  bool on_ssd = false;
  if (ssd_ != nullptr) {
    auto found = ssd_->Lookup(key);
    on_ssd = found.ok();
    if (on_ssd) {
      ssd_size = *found;
      ssd_->Remove(key);
    }
  }
  if (d.ok()) impl_->EmitDropped(why, HoldingTier::kDram, on_ssd, key, dram_size);
  if (on_ssd) impl_->EmitDropped(why, HoldingTier::kSsd, false, key, ssd_size);
  return d.ok() || on_ssd ? Status::Ok() : d;
}

uint64_t TieredStore::ClearNamespace(uint32_t tag) {
  std::vector<KeyId> keys;
  uint64_t dropped = 0;
  auto drop = [&] {
    for (const KeyId& k : keys) dropped += Remove(k).ok() ? 1 : 0;
    keys.clear();
  };
  auto sweep_dram = [&] {
    dram_->ListEntries([&](const KeyId& k, uint64_t) {
      if (NamespaceTagOf(k) == tag) keys.push_back(k);
    });
    drop();
  };
  sweep_dram();
  if (ssd_ != nullptr) {
    ssd_->ListEntries([](uint64_t) { return true; }, [&](const std::vector<SsdEntry>& batch) {
      for (const SsdEntry& e : batch) {
        if (NamespaceTagOf(e.key) == tag) keys.push_back(e.key);
      }
      return true;
    });
    drop();
    sweep_dram();  // promoted from SSD while the listing ran
  }
  return dropped;
}

Status TieredStore::Flush() { return ssd_ != nullptr ? ssd_->Flush() : Status::Ok(); }

Status TieredStore::Close() {
  if (ssd_ == nullptr) return Status::Ok();
  // No demotions into a closing tier: an eviction from now on drops the entry.
  impl_->ssd_open.store(false, std::memory_order_release);
  // Set again under the DRAM tier's lock: a demotion running now has ended.
  SetDemotionListener();
  return ssd_->Close();
}

uint64_t TieredStore::ListHeld(const SsdKeyFilter& want, const HeldSink& fn) {
  bool go = true;
  uint64_t n = 0;
  std::vector<KeyId> listed;  // DRAM's, when an SSD tier is listed next
  dram_->ListEntries([&](const KeyId& key, uint64_t size) {
    if (!go || (want && !want(key.hi))) return;
    ++n;
    go = fn(key, size, HoldingTier::kDram);
    if (ssd_ != nullptr) listed.push_back(key);
  });
  if (!go || ssd_ == nullptr) return n;
  std::sort(listed.begin(), listed.end());
  ssd_->ListEntries(
      want ? want : [](uint64_t) { return true; },
      [&](const std::vector<SsdEntry>& batch) {
        for (const SsdEntry& e : batch) {
          if (std::binary_search(listed.begin(), listed.end(), e.key)) continue;
          ++n;
          if (!fn(e.key, e.size, HoldingTier::kSsd)) return false;
        }
        return true;
      });
  return n;
}

std::span<uint8_t> TieredStore::segment() const {
  return {dram_->segment_base(), dram_->segment_bytes()};
}

SsdStats TieredStore::GetSsdStats() const {
  KVPOOL_CHECK(ssd_ != nullptr);
  return ssd_->GetStats();
}

uint64_t TieredStore::DemoteAll() {
  if (ssd_ == nullptr) return 0;
  uint64_t written = 0;
  dram_->ForEachEntry([&](const KeyId& key, const uint8_t* data, uint64_t size) {
    if (ssd_->Contains(key)) return;
    if (ssd_->Insert(key, data, size)) ++written;
  });
  return written;
}

Result<HintResult> TieredStore::Hint(HintOp op, std::span<const KeyId> keys,
                                     std::chrono::nanoseconds ttl, uint8_t priority) {
  switch (op) {
    case HintOp::kRetain:
      return Retain(keys, ttl, priority);
    case HintOp::kPin:
      return PinFor(keys, ttl);
    case HintOp::kDemote:
      return Demote(keys);
    case HintOp::kRelease:
      return ReleaseLeases(keys);
    case HintOp::kPrefetch:
      break;
  }
  return InvalidArgument("not a hint answered at once");
}

Result<HintResult> TieredStore::Demote(std::span<const KeyId> keys) {
  SsdStore* ssd = impl_->ssd_open.load(std::memory_order_acquire) ? ssd_ : nullptr;
  std::vector<Pin> pins;
  KVPOOL_ASSIGN_OR_RETURN(HintResult r, dram_->Demote(keys, ssd != nullptr ? &pins : nullptr));
  // Outside the DRAM lock: the copy to SSD may wait for buffer room.
  for (Pin& pin : pins) {
    const KeyId key = pin.key();
    const bool held = ssd->Contains(key) || ssd->Insert(key, pin.data(), pin.size());
    pin.Reset();
    if (!held) continue;
    uint64_t size = 0;
    if (!dram_->Remove(key, &size).ok()) continue;  // gone meanwhile
    impl_->EmitDropped(HoldingsEvent::Why::kMovedToSsd, HoldingTier::kDram, true, key, size);
    ++r.moved;
  }
  return r;
}

void TieredStore::Prefetch(std::span<const KeyId> keys, PrefetchDone done) {
  if (keys.size() > dram_->hint_max_keys()) {
    done(InvalidArgument("a hint names " + std::to_string(keys.size()) +
                         " keys, more than the most of " + std::to_string(dram_->hint_max_keys())));
    return;
  }
  struct Pending {
    std::mutex mu;
    HintResult r;
    size_t waiting = 1;  // the promotions, and the loop below until it ends
    PrefetchDone done;
  };
  auto p = std::make_shared<Pending>();
  p->done = std::move(done);
  auto end_one = [p] {
    bool last = false;
    {
      std::lock_guard lock(p->mu);
      last = --p->waiting == 0;
    }
    if (last) p->done(p->r);
  };
  DramStore* dram = dram_;
  for (const KeyId& key : keys) {
    if (dram_->Contains(key)) {
      std::lock_guard lock(p->mu);
      ++p->r.applied;
      continue;
    }
    if (ssd_ == nullptr || !ssd_->Contains(key)) {
      std::lock_guard lock(p->mu);
      ++p->r.unknown;
      continue;
    }
    {
      std::lock_guard lock(p->mu);
      ++p->waiting;
    }
    Promote(key, [p, dram, key, end_one](Status s, Pin pin) {
      const bool ok = s.ok() && pin.valid();
      pin.Reset();
      if (ok) dram->MarkPrefetched({&key, 1});
      {
        std::lock_guard lock(p->mu);
        if (ok) {
          ++p->r.applied;
          ++p->r.moved;
        } else {
          ++p->r.unknown;
        }
      }
      end_one();
    });
  }
  end_one();
}

void TieredStore::Promote(const KeyId& key, PromoteDone done) {
  if (ssd_ == nullptr) {
    done(NotFound("no SSD tier"), DramStore::Pin());
    return;
  }
  {
    std::lock_guard lock(impl_->mu);
    auto [it, first] = impl_->inflight.try_emplace(key);
    it->second.push_back(std::move(done));
    if (!first) {
      impl_->promotion_shared->Inc();
      return;
    }
  }
  Impl* impl = impl_.get();
  impl_->executor->Submit([impl, key] { impl->RunPromotion(key); });
}

}  // namespace kvpool
