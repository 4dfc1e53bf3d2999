// DramStore: the DRAM tier. One shared-memory segment (memfd) carved by a
// slab allocator into size classes, an index key id -> slot, byte-aware
// scan-resistant eviction (S3-FIFO; LRU for comparison), and RAII pins.
//
// Clients map the segment (segment_fd) and read or write slots in place: a
// put reserves a slot, the writer fills it, then commits; a get pins the
// entry and reads it. A pinned entry is never evicted, moved or reused while
// pinned; a reserved slot is invisible to readers until committed.
//
// Thread-safe. Reservation and Pin handles may be destroyed on any thread;
// they must not outlive the store.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/key_id.h"
#include "common/metrics.h"
#include "common/status.h"

namespace kvpool {

// The eviction policies' names (DramOptions::eviction).
inline constexpr std::array<std::string_view, 6> kEvictionPolicies = {
    "prefix", "s3fifo", "lru", "slru", "prefix-fixed", "tinylfu"};

struct DramOptions {
  // What the cache holds: committed entries never take more slot bytes
  // than this. More caches more.
  uint64_t capacity_bytes = 1ull << 30;
  // Memory beyond capacity_bytes for values read from elsewhere: a value
  // fetched from a peer for one read (ReserveForRead; dropped when it is
  // released) takes a free slot there before it makes an entry go. Writes
  // make room within the capacity as without one. A multiple of
  // slab_bytes; 0: none. The shared segment is capacity_bytes +
  // read_room_bytes; it is pre-faulted at start.
  uint64_t read_room_bytes = 0;
  // Unit of memory moved between size classes. Larger wastes less on big
  // values; smaller lets the class mix adapt with finer steps.
  uint64_t slab_bytes = 4ull << 20;
  // Largest value accepted. Values above slab_bytes take runs of whole slabs.
  uint64_t max_value_bytes = 64ull << 20;
  // Smallest size class; classes grow by class_growth up to slab_bytes.
  uint64_t min_class_bytes = 64;
  double class_growth = 1.25;
  // Try MFD_HUGETLB (then transparent huge pages); falls back to 4 KiB pages.
  bool huge_pages = true;
  // Touch every page at start so the first pass over memory is not 20x slower.
  bool prefault = true;
  // One of kEvictionPolicies: "prefix" (default: segmented LRU with a
  // ghost and ageing, its protected share chosen by sampled shadow caches,
  // for LLM prefix traffic; docs/eviction.md), "s3fifo", "lru",
  // "prefix-fixed" (prefix at a fixed share of 70%), "slru" (that
  // without ageing) or "tinylfu" (W-TinyLFU), for comparison.
  std::string eviction = "prefix";
  // Seal the segment's fd against writes: clients it is handed to can map
  // it read-only only (the node writes through its own mapping).
  bool seal_client_writes = false;
  // What eviction ages are measured with, and leases' TTLs (null: the
  // steady clock).
  const Clock* clock = nullptr;
  // Cache hints (DramStore::Retain, PinFor): values that pins may hold at
  // once (0: no pins), the longest TTL a hint may ask, and the most keys
  // one hint may name.
  uint64_t pin_max_bytes = 0;
  std::chrono::nanoseconds hint_max_ttl = std::chrono::hours(24);
  uint64_t hint_max_keys = 8192;
  // Retained values take at most this percentage of capacity_bytes: past
  // it, the retained entries first in line to go lose their retention
  // (DramStore::Retain), so retention never starves the rest of the cache.
  uint32_t retain_max_percent = 50;

  Status Validate() const;
};

// The cache hints (docs/hints.md); the values are the wire's (the local
// protocol's Hint, the peers' kPeerHint, kvpool_hint_op).
enum class HintOp : uint8_t { kRetain = 1, kPin = 2, kPrefetch = 3, kDemote = 4, kRelease = 5 };
// "retain", "pin", ...; nullptr for a value that is no operation.
const char* HintOpName(HintOp op);
// The operation a wire value names (1..5), or nullopt.
std::optional<HintOp> HintOpOf(uint32_t wire);

// What a cache hint did (DramStore::Retain, PinFor, ReleaseLeases).
struct HintResult {
  uint64_t applied = 0;  // keys in DRAM it applied to
  uint64_t unknown = 0;  // keys not in DRAM: counted, not an error
  // Retentions it ended to stay within retain_max_percent (its own keys'
  // or earlier ones').
  uint64_t clipped = 0;
  // Keys it moved between tiers (TieredStore::Demote: to SSD;
  // TieredStore::Prefetch: into DRAM).
  uint64_t moved = 0;
};

struct DramClassStats {
  uint64_t slot_bytes = 0;
  uint64_t slabs = 0;
  uint64_t entries = 0;
};

// What an adaptive eviction policy has adapted (DramStats::eviction).
struct EvictionAdaptation {
  static constexpr size_t kCandidates = 5;
  bool adaptive = false;
  // The protected list's share of a class's slots now, and the candidates.
  double protected_share = 0;
  // Whether the chosen candidate inserts bimodally (ShadowShares::kBimodal).
  bool bimodal = false;
  std::array<double, kCandidates> candidate_shares{};
  std::array<bool, kCandidates> candidate_bimodal{};
  // Each candidate's shadow hit ratio over its recent sampled accesses.
  std::array<double, kCandidates> shadow_hit_ratios{};
  uint64_t share_changes = 0;
  double sample_rate = 0;     // fraction of keys the shadows follow
  uint64_t shadow_keys = 0;   // keys the shadows hold
  uint64_t shadow_bytes = 0;  // their memory (part of DramStats::index_bytes)
  uint64_t windows = 0;       // decision windows ended
};

struct DramStats {
  uint64_t capacity_bytes = 0;   // DramOptions::capacity_bytes
  uint64_t read_room_bytes = 0;  // DramOptions::read_room_bytes
  uint64_t used_bytes = 0;       // sum of committed value sizes
  uint64_t allocated_bytes = 0;  // bytes of slots holding committed or reserved values
  uint64_t entries = 0;
  uint64_t reserved = 0;         // outstanding reservations
  uint64_t pinned = 0;           // entries with at least one pin
  uint64_t evictions = 0;
  uint64_t lent = 0;             // evictions whose slot a lower tier kept to write from
  uint64_t slab_moves = 0;       // slabs taken from one class for another
  // Holds of the store's lock to look keys up (Acquire, AcquireBatch,
  // Contains): a batched read costs one.
  uint64_t lookup_rounds = 0;
  uint64_t index_bytes = 0;      // memory of the index and eviction metadata
  double index_bytes_per_entry = 0;  // index_bytes / capacity in entries at the current mix
  bool huge_pages = false;           // on hugetlbfs pages
  uint64_t huge_page_bytes = 0;      // of the segment on 2 MiB pages (Segment::huge_page_bytes)
  // Cache hints' leases now (DramStore::Retain, PinFor), and leases that
  // ran out (not released or removed) since start.
  uint64_t retained_entries = 0;
  uint64_t retained_bytes = 0;
  uint64_t hint_pinned_entries = 0;
  uint64_t hint_pinned_bytes = 0;
  uint64_t leases_expired = 0;
  uint64_t retains_clipped = 0;  // retentions ended by retain_max_percent
  uint64_t demoted_entries = 0;  // first in line to go (DramStore::Demote)
  // Prefetched entries (DramStore::MarkPrefetched): not read yet; read
  // (each once, at its first read) and the time from prefetch to that read,
  // summed; and those that left unread.
  uint64_t prefetched_entries = 0;
  uint64_t prefetch_hits = 0;
  double prefetch_lead_seconds = 0;
  uint64_t prefetch_unused = 0;
  // The mean time from a prefetch to its entry's first read (0: no hit yet).
  double prefetch_mean_lead_seconds() const {
    return prefetch_hits == 0 ? 0 : prefetch_lead_seconds / static_cast<double>(prefetch_hits);
  }
  EvictionAdaptation eviction;  // what the eviction policy adapts
  std::vector<DramClassStats> classes;
};

class DramStore {
 public:
  template <void (DramStore::*kGiveBack)(uint32_t)>
  class SlotHandle;
  class Reservation;
  class Pin;

  static Result<std::unique_ptr<DramStore>> Open(const DramOptions& options,
                                                 MetricsRegistry* metrics);
  virtual ~DramStore() = default;

  // The segment, for passing to clients. Valid for the store's lifetime.
  virtual int segment_fd() const = 0;
  virtual uint64_t segment_bytes() const = 0;
  virtual uint8_t* segment_base() const = 0;
  virtual uint64_t max_value_bytes() const = 0;
  // DramOptions::hint_max_keys.
  virtual uint64_t hint_max_keys() const = 0;
  // Whether a batch's hits should be acquired last to first (the eviction
  // policy keeps a chain's head longest: EvictionPolicy::TouchChainsHeadLast).
  virtual bool touch_chains_head_last() const = 0;

  // Reserves a slot of `size` bytes for `key`. AlreadyExists when the key is
  // committed; InvalidArgument for size 0 or over max_value_bytes;
  // ResourceExhausted when nothing can be evicted to make room.
  virtual Result<Reservation> Reserve(const KeyId& key, uint64_t size) = 0;
  // As Reserve, for a value read from elsewhere for one read (a fetch from
  // another node): it takes a free slot of the read room before anything is
  // evicted, and counts against the capacity only if it is committed (a
  // replica). A plain Reserve makes room within the capacity first, so the
  // read room is left to these.
  virtual Result<Reservation> ReserveForRead(const KeyId& key, uint64_t size) = 0;
  // The entry a batch committed last, so the next one of the same batch can
  // be placed relative to it in the eviction order (Commit). A place made
  // by After(key) names only the key (a chain whose previous block was
  // committed by another request): Commit finds its entry.
  struct ChainPlace {
    static constexpr uint32_t kByKey = UINT32_MAX - 1;
    uint32_t slot = UINT32_MAX;
    KeyId key{};
    // The chain's leading run so far as the eviction policy judges it
    // (EvictionPolicy::Insert): where a read of the chain left it
    // (AcquireBatch), or all set for a chain of its own.
    uint8_t run = UINT8_MAX;
    static ChainPlace After(const KeyId& k) { return ChainPlace{kByKey, k}; }
  };
  // Publishes the reserved bytes. AlreadyExists when another writer committed
  // the key first: this writer's slot is freed and the first value stays.
  // With `chain`, the entries committed with the same ChainPlace are one
  // block chain in order: a policy that keeps chains from their head
  // (touch_chains_head_last) places each just colder than the one before,
  // so the chain's tail goes first. *chain is updated to this entry.
  // returning: the writer knows the key left the cache lately (a pool's
  // directory said so): the policy treats it as a hit in its own ghost.
  virtual Status Commit(Reservation reservation, ChainPlace* chain = nullptr,
                        bool returning = false) = 0;
  // Commit, then pin the entry in the same step, so nothing can evict it in
  // between (a promotion hands its pin to the get that waits for it). When
  // another writer committed the key first, pins that entry instead.
  // replica: the entry is a copy of one another node holds, made for a read
  // here: the policy may place it first in line to go (the prefix policy
  // does, so replicas never crowd out what this node holds alone), and the
  // pin does not count as an access.
  virtual Result<Pin> CommitAndAcquire(Reservation reservation, bool replica = false) = 0;
  // Pins a reservation's bytes for reading without committing them: the
  // value is never in the index (no reader finds it, it is not evicted, and
  // it is not an access), and its slot is freed when the pin is released
  // (its bytes stay until the slot is reused, as an evicted entry's do; a
  // removal's are cleared). A read-through copy of a value another node
  // holds, not kept here.
  virtual Result<Pin> PinUncommitted(Reservation reservation) = 0;
  // Pins the committed entry for reading. NotFound on a miss.
  virtual Result<Pin> Acquire(const KeyId& key) = 0;
  // Pins, under one hold of the lock, each keys[i] committed whose pins[i]
  // is empty (a miss leaves it empty). The batch is a block chain in order:
  // its entries are touched in the order the eviction policy keeps chains
  // by (last to first when it keeps a chain's head longest). Returns how
  // many it pinned. *run (if not null): the chain's leading run at its end
  // as the policy judges it, for ChainPlace::run of the chain's writes
  // that follow. REQUIRES: pins.size() == keys.size().
  virtual size_t AcquireBatch(std::span<const KeyId> keys, std::span<Pin> pins,
                              uint8_t* run = nullptr) = 0;
  // True when committed. Does not count as an access for eviction.
  virtual bool Contains(const KeyId& key) const = 0;
  // Drops the entry from the index; its slot is reused once unpinned. Sets
  // *removed_size (when given) to the entry's size.
  virtual Status Remove(const KeyId& key, uint64_t* removed_size = nullptr) = 0;

  // Cache hints: leases on committed entries, which a writer or a router
  // sets because it knows what comes back (docs/hints.md). Advisory: they
  // change what is evicted when, never the bytes a read returns.
  //
  // Retain: until ttl has passed, the entries go last in their size
  // class's eviction order; then they return to the policy's order as if
  // just written. They are still evicted when nothing else of their class
  // can be: the lowest priority first, then the least recently retained
  // (retaining again refreshes), and within one hint the last key first (a
  // chain retained in order goes from its tail). Retained values take at
  // most retain_max_percent of the capacity: past it, retentions end in
  // that same order (HintResult::clipped) and their entries return to the
  // policy's order.
  // PinFor: until ttl has passed, the entries are not evicted (and a slab
  // holding one is not moved to another class). At most pin_max_bytes of
  // values are so held: a batch that would pass it is ResourceExhausted.
  // Either: InvalidArgument for a ttl of 0 or over hint_max_ttl, or more
  // than hint_max_keys keys. On an error nothing changes. A lease is never
  // shortened by another (the later expiry stays); a pin replaces a
  // retention, and a retention leaves a pin as it is.
  virtual Result<HintResult> Retain(std::span<const KeyId> keys, std::chrono::nanoseconds ttl,
                                    uint8_t priority) = 0;
  virtual Result<HintResult> PinFor(std::span<const KeyId> keys, std::chrono::nanoseconds ttl) = 0;
  // Ends the keys' leases now: their entries return to the policy's order
  // as if just written.
  virtual HintResult ReleaseLeases(std::span<const KeyId> keys) = 0;
  // Demote: the entries go first in line to leave their size class (the
  // first demoted first), ending any lease they had; a read does not move
  // them back (Retain, PinFor or ReleaseLeases does). With pins, each entry
  // found is also pinned there, without counting an access (a caller
  // writing them to a lower tier before it removes them), but for one
  // already at the most pins a slot can hold. InvalidArgument
  // for more than hint_max_keys keys.
  virtual Result<HintResult> Demote(std::span<const KeyId> keys, std::vector<Pin>* pins) = 0;
  // Marks the entries as brought in ahead of use (a prefetch): the first
  // read of each counts a prefetch hit and its lead time; one evicted or
  // removed unread counts as unused (DramStats). Returns how many it found.
  virtual uint64_t MarkPrefetched(std::span<const KeyId> keys) = 0;

  // Called for each entry evicted (not removed), with its bytes still intact,
  // while the store's lock is held: it must be quick and must not call back
  // into the store. For write-back to a lower tier.
  //
  // lend, when not null (an eviction that makes room in the capacity while
  // the read room has memory for the reservation: not one for memory
  // itself, nor one that empties a slab for another size class; never
  // without a read room), lets the listener keep
  // the bytes where they are instead of copying them: calling it (at most
  // once, during the call) returns a pin of the evicted slot. The entry
  // still leaves the index and the capacity at once, but its slot is not
  // reused until that pin is released, which must happen without this
  // store's lock held. The eviction that lent goes on to evict another
  // entry if it still needs memory.
  using Lend = std::function<Pin()>;
  using EvictionListener =
      std::function<void(const KeyId& key, const uint8_t* data, uint64_t size, const Lend* lend)>;
  virtual void SetEvictionListener(EvictionListener listener) = 0;
  // Calls fn for every committed entry with its bytes, under the store's
  // lock (the same rules as the eviction listener). For writing DRAM out to
  // a lower tier at shutdown.
  using EntryVisitor = std::function<void(const KeyId& key, const uint8_t* data, uint64_t size)>;
  virtual void ForEachEntry(const EntryVisitor& fn) const = 0;
  // Calls fn(key, size) for the committed entries, taking the store's lock
  // for a few thousand slots at a time and calling fn without it, so puts
  // and gets wait at most that long and fn may call into the store. An entry
  // present throughout is listed once; one committed or removed meanwhile
  // may or may not be. For republishing what this node holds.
  virtual void ListEntries(const std::function<void(const KeyId&, uint64_t)>& fn) const = 0;

  virtual DramStats GetStats() const = 0;

 protected:
  // Called by the handles.
  virtual void AbortReservation(uint32_t slot) = 0;
  virtual void Unpin(uint32_t slot) = 0;
};

// What Reservation and Pin share: one slot of the store, moved, never
// copied, given back (kGiveBack) when the handle is reset or destroyed.
template <void (DramStore::*kGiveBack)(uint32_t)>
class DramStore::SlotHandle {
 public:
  SlotHandle() = default;
  SlotHandle(DramStore* store, uint32_t slot, const KeyId& key, uint64_t offset, uint64_t size)
      : store_(store), slot_(slot), key_(key), offset_(offset), size_(size) {}
  SlotHandle(SlotHandle&& o) noexcept { *this = std::move(o); }
  SlotHandle& operator=(SlotHandle&& o) noexcept {
    if (this != &o) {
      Reset();
      store_ = o.store_;
      slot_ = o.slot_;
      key_ = o.key_;
      offset_ = o.offset_;
      size_ = o.size_;
      o.store_ = nullptr;
    }
    return *this;
  }
  ~SlotHandle() { Reset(); }
  void Reset() {
    if (store_ != nullptr) (store_->*kGiveBack)(slot_);
    store_ = nullptr;
  }

  bool valid() const { return store_ != nullptr; }
  uint32_t slot() const { return slot_; }
  const KeyId& key() const { return key_; }
  uint64_t offset() const { return offset_; }  // from the segment's base
  uint64_t size() const { return size_; }

 protected:
  DramStore* store_ = nullptr;
  uint32_t slot_ = 0;
  KeyId key_;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

// Move-only. Destroying an uncommitted reservation aborts it.
class DramStore::Reservation : public SlotHandle<&DramStore::AbortReservation> {
 public:
  using SlotHandle::SlotHandle;
  // Gives up ownership without aborting (the store's Commit uses it).
  uint32_t Release() {
    store_ = nullptr;
    return slot_;
  }
  // The reserved bytes, written before Commit. REQUIRES: valid().
  uint8_t* data() const { return store_->segment_base() + offset_; }
  std::span<uint8_t> bytes() const { return {data(), size_}; }
};

// Move-only. Destroying a pin releases it.
class DramStore::Pin : public SlotHandle<&DramStore::Unpin> {
 public:
  using SlotHandle::SlotHandle;
  // The entry's bytes, immutable while pinned. REQUIRES: valid().
  const uint8_t* data() const { return store_->segment_base() + offset_; }
  std::span<const uint8_t> bytes() const { return {data(), size_}; }
};

}  // namespace kvpool
