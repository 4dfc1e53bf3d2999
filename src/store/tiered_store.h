// TieredStore: the DRAM tier over the optional SSD tier.
//
// DRAM eviction demotes entries to SSD (write-back, filtered by an
// admission policy); a get that misses DRAM and hits SSD promotes the entry
// into a DRAM slot (Promote) and is then served from DRAM through the same
// zero-copy path. Concurrent promotions of one key share one SSD read.
// Values are immutable across tiers: a key present in either tier is
// AlreadyExists for a new put.
//
// Thread-safe. Promotions run on the executor given at construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/executor.h"
#include "common/key_id.h"
#include "common/metrics.h"
#include "common/status.h"
#include "store/dram/dram_store.h"

namespace kvpool {

class SsdStore;

struct TieringOptions {
  // Which DRAM evictions are written to SSD: 0 = every one; N > 0 = entries
  // read at least N times while cached (estimated by a frequency sketch; at
  // most 15), to spare SSD wear from one-time values.
  uint32_t admit_min_reads = 0;

  Status Validate() const;
};

class TieredStore {
 public:
  // dram must outlive the store; ssd may be null (DRAM only).
  TieredStore(DramStore* dram, SsdStore* ssd, Executor* executor, const TieringOptions& options,
              MetricsRegistry* metrics);
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  DramStore* dram() const { return dram_; }
  SsdStore* ssd() const { return ssd_; }

  // As DramStore::Reserve, but AlreadyExists also when the key is on SSD.
  // With an SSD tier, first waits (bounded) until it has room for a
  // demotion, so the evictions under the DRAM lock never wait for I/O.
  Result<DramStore::Reservation> Reserve(const KeyId& key, uint64_t size);
  Status Commit(DramStore::Reservation reservation) { return dram_->Commit(std::move(reservation)); }
  // DRAM only: NotFound when the entry is not in DRAM (see NeedsPromotion).
  Result<DramStore::Pin> Acquire(const KeyId& key);
  // In either tier.
  bool Contains(const KeyId& key) const;
  // True when the key is on SSD but not in DRAM: Promote before Acquire.
  bool NeedsPromotion(const KeyId& key) const;
  // Removes from both tiers; OK when it was in either.
  Status Remove(const KeyId& key);

  // Copies every DRAM entry that is not on SSD yet into the SSD tier (for a
  // clean shutdown: the restarted node keeps its whole cache). Returns how
  // many were written; call Flush after. Holds the DRAM tier's lock.
  uint64_t DemoteAll();

  // Writes the SSD tier's partly filled region buffers and waits for them:
  // what was demoted so far survives a crash. OK without an SSD tier.
  Status Flush();

  // Reads the key from SSD into a DRAM slot, then calls done (on an executor
  // thread, or inline when there is no SSD tier) with a pin on the entry, so
  // it cannot be evicted before the waiting request reads it: OK when the key
  // is in DRAM now; NotFound, Corruption or IOError when it could not be
  // brought in (the pin is empty then).
  using PromoteDone = std::function<void(Status, DramStore::Pin)>;
  void Promote(const KeyId& key, PromoteDone done);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DramStore* const dram_;
  SsdStore* const ssd_;
};

}  // namespace kvpool
