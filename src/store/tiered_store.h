// TieredStore: the store's one face -- the DRAM tier over the optional SSD
// tier. Code above src/store/ reaches the tiers only through it.
//
// DRAM eviction demotes entries to SSD (write-back, filtered by an
// admission policy); a get that misses DRAM and hits SSD promotes the entry
// into a DRAM slot (AcquireOrPromote) and is then served from DRAM through
// the same zero-copy path. Concurrent promotions of one key share one SSD
// read. Values are immutable across tiers: a key present in either tier is
// AlreadyExists for a new put.
//
// Every change of what it holds is told to its HoldingsObserver, from one
// place (store/holdings.h: the holdings stream).
//
// Thread-safe. Promotions run on the executor given at construction. A store
// made by Open owns its tiers; one constructed over tiers does not.
// Reservation and Pin are RAII handles on DRAM slots (data() gives their
// bytes); they must not outlive the store.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/executor.h"
#include "common/key_id.h"
#include "common/metrics.h"
#include "common/status.h"
#include "store/dram/dram_store.h"
#include "store/holdings.h"
#include "store/ssd/ssd_store.h"

namespace kvpool {

class SsdStore;

struct TieringOptions {
  // Which DRAM evictions are written to SSD: 0 = every one; N > 0 = entries
  // read at least N times while cached (estimated by a frequency sketch; at
  // most 15), to spare SSD wear from one-time values.
  uint32_t admit_min_reads = 0;
  // A demotion leaves the value's bytes in its DRAM slot, held by the SSD
  // tier, until the region's flush copies them into its buffer or -- on a
  // segment of 2 MiB pages (LendTermsFor), for values of 256 KiB and more --
  // writes them from the slot (SsdStore::InsertLent): nothing is copied
  // under the DRAM lock. The held slots' memory is the DRAM read room's: at
  // most half of it is held so at once, and without a read room nothing is;
  // past that, or when the SSD tier cannot take it now, the eviction copies.
  bool demote_in_place = true;

  Status Validate() const;
};

// The terms of demotions in place for a DRAM tier with these stats on a
// segment of segment_bytes: at most half the read room lent at once; gather
// writes from the slots where the segment is on 2 MiB pages (hugetlb, or
// transparent ones under 9/10 of it), for at most half of what is lent.
LendTerms LendTermsFor(const DramStats& ds, uint64_t segment_bytes);

class TieredStore {
 public:
  using Reservation = DramStore::Reservation;
  using Pin = DramStore::Pin;
  using PromoteDone = std::function<void(Status, Pin)>;
  // Where a batch's last committed entry went, so the next one of the same
  // batch (a block chain in order) is placed relative to it in the eviction
  // order (Commit). Chain::After(key) names only the block before (a chain
  // whose previous block another request committed).
  using Chain = DramStore::ChainPlace;

  // Opens the DRAM tier and, when ssd is non-null, the SSD tier under it
  // (its max_value_bytes set to DRAM's; region writes on flush_executor).
  // Promotions run on promote_executor. The executors and metrics must
  // outlive the store.
  static Result<std::unique_ptr<TieredStore>> Open(const DramOptions& dram,
                                                   const SsdOptions* ssd,
                                                   Executor* promote_executor,
                                                   Executor* flush_executor,
                                                   const TieringOptions& options,
                                                   MetricsRegistry* metrics);
  // Over tiers owned elsewhere: dram (and ssd, which may be null: DRAM only)
  // must outlive the store.
  TieredStore(DramStore* dram, SsdStore* ssd, Executor* executor, const TieringOptions& options,
              MetricsRegistry* metrics);
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // --- Writing.
  // As DramStore::Reserve, but AlreadyExists also when the key is on SSD.
  // With an SSD tier, first waits (bounded) until it has room for a
  // demotion, so the evictions under the DRAM lock never wait for I/O.
  Result<Reservation> Reserve(const KeyId& key, uint64_t size);
  // As Reserve, for a value fetched from another node for one read
  // (DramStore::ReserveForRead: it takes the read room before evicting).
  Result<Reservation> ReserveForRead(const KeyId& key, uint64_t size);
  // Publishes the reserved bytes (DramStore::Commit, with its chain place);
  // told to the observer as written by `origin`.
  Status Commit(Reservation reservation, WriteOrigin origin = WriteOrigin::kPut,
                Chain* chain = nullptr, bool returning = false);
  // How a put is committed (Commit's arguments).
  struct PutPlace {
    WriteOrigin origin = WriteOrigin::kPut;
    Chain* chain = nullptr;
    bool returning = false;
  };
  // One put of a value held in memory (a client's put, a peer's placement):
  // Reserve, copy the value in, Commit; the first error of those. With
  // before_commit, it is called (void()) after the copy, just before the
  // commit: the entry is not stored yet, and it is only when the reserve
  // succeeded.
  Status Put(const KeyId& key, std::span<const uint8_t> value, const PutPlace& place) {
    return Put(key, value, place, [] {});
  }
  template <typename BeforeCommit>
  Status Put(const KeyId& key, std::span<const uint8_t> value, const PutPlace& place,
             BeforeCommit&& before_commit);
  // Commit, then pin the entry in the same step (DramStore::CommitAndAcquire).
  Result<Pin> CommitAndAcquire(Reservation reservation, WriteOrigin origin = WriteOrigin::kPut);
  // A pin of the reservation's bytes that never becomes an entry
  // (DramStore::PinUncommitted): nothing is stored or announced.
  Result<Pin> PinUncommitted(Reservation reservation);

  // --- Reading.
  // Pins the entry if it is in DRAM, counting a read (for SSD admission):
  // NotFound when it is not in DRAM (it may be on SSD: AcquireOrPromote).
  Result<Pin> Acquire(const KeyId& key);
  // Counts a read of an entry pinned without Acquire or ReadBatch (a
  // fetched copy), for SSD admission.
  void CountRead(const KeyId& key);
  // What ReadBatch found of a batch's keys.
  struct BatchRead {
    std::vector<Pin> pins;         // per key, in request order: valid for a key DRAM held
    std::vector<uint32_t> cold;    // indexes of the keys only on SSD
    std::vector<uint32_t> absent;  // indexes of the keys in neither tier
    // The chain's leading run as the eviction policy judges it, for the
    // writes of the chain's rest (Chain::run; DramStore::AcquireBatch).
    uint8_t run = UINT8_MAX;
  };
  // Called once per cold key, from an executor thread, when its promotion
  // ends: its index, and its pin (empty when the promotion failed).
  using Promoted = std::function<void(uint32_t index, Pin pin)>;
  // One read of a batch of keys (a block chain in order). Pins, under one
  // hold of the DRAM lock, every key DRAM holds, in the order the eviction
  // policy reads chains in, each counted as a read. Each other key is cold
  // (on SSD) or absent. With `promoted`, each cold key's promotion starts
  // (as AcquireOrPromote's) and ends in promoted(index, pin); without, none
  // starts. The request waits only for its cold and absent keys.
  void ReadBatch(std::span<const KeyId> keys, BatchRead* out, const Promoted& promoted);
  // Pins, under one hold of the DRAM lock and in ReadBatch's order, each
  // keys[i] DRAM holds whose pins[i] is empty (a read that waited, before
  // it is answered); counted as reads. Returns how many it pinned. *run:
  // as BatchRead::run.
  size_t PinHeld(std::span<const KeyId> keys, std::span<Pin> pins, uint8_t* run = nullptr);
  // Calls fn(i) for i in [0, n), in the order the eviction policy wants a
  // chain of n blocks read (ReadBatch's): for reads of a batch issued one
  // by one, such as fetches from other nodes.
  template <typename Fn>
  void InChainReadOrder(size_t n, Fn&& fn) const {
    const bool head_last = dram_->touch_chains_head_last();
    for (size_t k = 0; k < n; ++k) fn(head_last ? n - 1 - k : k);
  }
  // Pins the entry wherever it is held and calls done(status, pin): inline
  // when it is in DRAM (OK) or in neither tier (NotFound, empty pin); when
  // it is only on SSD, after reading it into a DRAM slot, on an executor
  // thread: OK with a pin (so it cannot be evicted before the waiting
  // request reads it), or NotFound, Corruption, IOError with an empty pin.
  // A DRAM hit costs what Acquire costs: done is called, never copied or
  // stored. Done: callable as void(Status, Pin); a move-only one is moved
  // to the heap when it has to wait for a promotion.
  template <typename Done>
  void AcquireOrPromote(const KeyId& key, Done&& done);
  // In either tier.
  bool Contains(const KeyId& key) const;
  // The size of the entry wherever it is held; NotFound when in neither tier.
  Result<uint64_t> SizeOf(const KeyId& key);
  // The nearest tier holding the key, or nullopt (not counted as an
  // access; for status and tests).
  std::optional<HoldingTier> Where(const KeyId& key) const;

  // Removes from both tiers; OK when it was in either. `why` is what the
  // observer is told: kRemoved, or kHandedOff when another node took the
  // value over.
  Status Remove(const KeyId& key, HoldingsEvent::Why why = HoldingsEvent::Why::kRemoved);

  // Cache hints on the DRAM tier's entries (DramStore::Retain, PinFor,
  // ReleaseLeases). A key held only on SSD counts as unknown.
  Result<HintResult> Retain(std::span<const KeyId> keys, std::chrono::nanoseconds ttl,
                            uint8_t priority) {
    return dram_->Retain(keys, ttl, priority);
  }
  Result<HintResult> PinFor(std::span<const KeyId> keys, std::chrono::nanoseconds ttl) {
    return dram_->PinFor(keys, ttl);
  }
  HintResult ReleaseLeases(std::span<const KeyId> keys) { return dram_->ReleaseLeases(keys); }
  // One hint of those answered at once (not kPrefetch: Prefetch): Retain,
  // PinFor, Demote or ReleaseLeases. InvalidArgument for kPrefetch or a
  // value that is no operation.
  Result<HintResult> Hint(HintOp op, std::span<const KeyId> keys, std::chrono::nanoseconds ttl,
                          uint8_t priority);
  // Demote: with an SSD tier, each key's DRAM entry is written to SSD now
  // and then leaves DRAM (told as moved to SSD; HintResult::moved); one the
  // SSD tier cannot take stays, first in line to go. Without one, the
  // entries go first in line (DramStore::Demote). applied: keys found in
  // DRAM. Waits for SSD buffer room (bounded, as Insert).
  Result<HintResult> Demote(std::span<const KeyId> keys);
  // Prefetch: brings the keys held only on SSD into DRAM ahead of use, in
  // the background (on the promotion executor), and calls done once all
  // have ended: applied = keys in DRAM now (already, or brought in: moved),
  // unknown = keys in neither tier or whose read failed. Entries it brought
  // in are marked (DramStore::MarkPrefetched), so their first read counts
  // as a prefetch hit. InvalidArgument (done called at once) for more than
  // DramOptions::hint_max_keys keys. done may run on an executor thread.
  using PrefetchDone = std::function<void(Result<HintResult>)>;
  void Prefetch(std::span<const KeyId> keys, PrefetchDone done);
  // Marks DRAM entries brought in ahead of use by other means (a fetch from
  // another node): DramStore::MarkPrefetched. Returns how many it found.
  uint64_t MarkPrefetched(std::span<const KeyId> keys) { return dram_->MarkPrefetched(keys); }

  // Drops every entry whose key id carries namespace tag `tag`
  // (common/key_id.h), from both tiers, each told as kRemoved. Returns how
  // many keys were dropped. When it returns, every key of the namespace
  // committed before the call is a miss; one put while it runs may stay or
  // go. Walks DRAM's index; with an SSD tier also lists the SSD tier, which
  // reads its record headers (blocks on the device).
  uint64_t ClearNamespace(uint32_t tag);

  // --- The holdings stream (store/holdings.h).
  // Sets the observer of one slot (null: none); each slot's observer is
  // told every event, in slot order. Returns only when no call of the
  // previous observer is running (so not from within one). The observer
  // must outlive its setting.
  void SetHoldingsObserver(HoldingsObserver* observer,
                           HoldingsSlot slot = HoldingsSlot::kCluster);

  // --- Durability.
  // Copies every DRAM entry that is not on SSD yet into the SSD tier (for a
  // clean shutdown: the restarted node keeps its whole cache). Returns how
  // many were written; call Flush after. Holds the DRAM tier's lock.
  uint64_t DemoteAll();
  // Writes the SSD tier's partly filled region buffers and waits for them:
  // what was demoted so far survives a crash. OK without an SSD tier.
  Status Flush();
  // Stops demoting, then flushes, checkpoints and closes the SSD tier (a
  // warm restart finds it). OK without an SSD tier. Idempotent; reads and
  // writes of DRAM go on working.
  Status Close();

  // --- Inventory (what this store holds: for the cluster's directory, its
  // anti-entropy and the KV events' start).
  bool has_ssd_tier() const { return ssd_ != nullptr; }
  // fn(key, size, tier) once per key this store holds: DRAM's committed
  // entries (a few thousand slots per hold of the DRAM lock), then the SSD
  // tier's (blocking on the device) but for exactly those DRAM listed, so
  // a key promoted or demoted meanwhile is listed once. want(key.hi) picks
  // the keys (null: all); fn returns false to stop the listing. Returns the
  // number of keys fn was called for.
  using HeldSink = std::function<bool(const KeyId&, uint64_t size, HoldingTier tier)>;
  uint64_t ListHeld(const SsdKeyFilter& want, const HeldSink& fn);

  // --- The shared segment clients map, and figures.
  int segment_fd() const { return dram_->segment_fd(); }
  uint64_t segment_bytes() const { return dram_->segment_bytes(); }
  // All of the segment (for registering it with a transport).
  std::span<uint8_t> segment() const;
  uint64_t max_value_bytes() const { return dram_->max_value_bytes(); }
  DramStats GetDramStats() const { return dram_->GetStats(); }
  // REQUIRES: has_ssd_tier().
  SsdStats GetSsdStats() const;

 private:
  struct Impl;
  void Promote(const KeyId& key, PromoteDone done);
  // AlreadyExists when the key is on SSD; else waits (bounded) for room
  // for a demotion (see Reserve).
  Status BeforeReserve(const KeyId& key, uint64_t size);

  // Sets the DRAM tier's eviction listener to the demotion path.
  void SetDemotionListener();

  std::unique_ptr<DramStore> owned_dram_;  // set by Open
  std::unique_ptr<SsdStore> owned_ssd_;    // set by Open with an SSD tier
  std::unique_ptr<Impl> impl_;
  DramStore* const dram_;
  SsdStore* const ssd_;
};

template <typename Done>
void TieredStore::AcquireOrPromote(const KeyId& key, Done&& done) {
  auto pin = Acquire(key);
  if (pin.ok()) return done(Status::Ok(), std::move(pin).value());
  // Not Where(): a promotion may have finished since the Acquire above,
  // and a key on SSD is promoted, or pinned where it now lies in DRAM, by
  // Promote.
  if (ssd_ == nullptr || !ssd_->Contains(key)) return done(std::move(pin).TakeStatus(), Pin());
  using D = std::decay_t<Done>;
  if constexpr (std::is_copy_constructible_v<D>) {
    Promote(key, PromoteDone(std::forward<Done>(done)));
  } else {
    auto held = std::make_shared<D>(std::forward<Done>(done));
    Promote(key, [held](Status s, Pin p) { (*held)(std::move(s), std::move(p)); });
  }
}

template <typename BeforeCommit>
Status TieredStore::Put(const KeyId& key, std::span<const uint8_t> value, const PutPlace& place,
                        BeforeCommit&& before_commit) {
  auto slot = Reserve(key, value.size());
  if (!slot.ok()) return std::move(slot).TakeStatus();
  std::memcpy(slot->data(), value.data(), value.size());
  before_commit();
  return Commit(std::move(slot).value(), place.origin, place.chain, place.returning);
}

}  // namespace kvpool
