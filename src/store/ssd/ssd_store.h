// SsdStore: the SSD tier. One preallocated file per directory (one
// directory per NVMe drive), each written as a log of large regions:
// entries are appended into an in-memory region buffer and flushed whole
// (O_DIRECT), so the device sees only large sequential writes; the oldest
// region is reclaimed when space runs out. Every record carries a
// self-describing, CRC32C-checked header (ssd_format.h); every read is
// verified, and a record that does not verify, or names another key, is a
// counted miss whose index entry is dropped. The index is rebuilt on start:
// from a checkpoint written at clean shutdown, else by scanning regions.
//
// Thread-safe. Background work (region flushes) runs on the executor given
// to Open; no thread of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/executor.h"
#include "common/key_id.h"
#include "common/metrics.h"
#include "common/status.h"
#include "store/ssd/device.h"

namespace kvpool {

struct SsdOptions {
  // One file per directory; entries spread across them.
  std::vector<std::string> dirs;
  // Total bytes across all directories (split evenly).
  uint64_t capacity_bytes = 0;
  // Unit of writing and of reclamation. Larger: fewer, bigger writes;
  // smaller: finer-grained eviction.
  uint64_t region_bytes = 16ull << 20;
  // Region buffers per directory (one filling, the rest flushing). More
  // absorbs bursts of demotions; each costs region_bytes of memory.
  uint32_t buffers_per_dir = 6;
  // Reclaiming a region re-inserts entries read at least this many times
  // since they were written (0: never re-insert).
  uint32_t reinsert_min_reads = 0;
  // How long Insert waits for a region buffer when all are being written
  // before dropping the value: bounds how far demotions may throttle the
  // writer (DRAM eviction) to the device's speed. 0: never wait.
  std::chrono::milliseconds insert_wait{200};
  // Largest value stored (records bigger than a region are refused).
  uint64_t max_value_bytes = 64ull << 20;
  // Test seam; empty: FileDeviceFactory().
  DeviceFactory device_factory;
  // A directory written in another on-disk format version (ssd_format.h)
  // cannot be read. false: the store does not open (FailedPrecondition
  // naming the directory, both versions and how to wipe it); true: the
  // directory is reinitialized and starts empty.
  bool wipe_other_format = false;
  // The clock a directory's pause after a full disk (1 s) runs by; null:
  // SystemClock. Not owned.
  const Clock* clock = nullptr;

  Status Validate() const;
};

struct SsdDirStats {
  std::string dir;
  std::string device_kind;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t reads = 0;
  uint64_t writes = 0;
  bool online = true;
};

struct SsdStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;   // bytes of regions holding live records
  uint64_t entries = 0;
  uint64_t index_bytes = 0;
  double index_bytes_per_entry = 0;
  uint64_t reads = 0, read_bytes = 0, writes = 0, write_bytes = 0;
  uint64_t crc_failures = 0;      // records that did not verify (all kinds)
  uint64_t region_evictions = 0;
  uint64_t inserts_dropped = 0;   // demotions refused: buffers full, offline, too large
  uint64_t lent_bytes = 0;        // payload bytes demoted in place, their DRAM slots still held
  bool online = true;
  std::string offline_reason;
  std::string recovery;           // "checkpoint", "scan", "cold: <reason>"
  std::vector<SsdDirStats> dirs;
};

// One value held on SSD, as its record header names it.
struct SsdEntry {
  KeyId key;
  uint64_t size = 0;  // value bytes
};
// Which entries a listing wants, by KeyId::hi (all the index keeps of a key;
// a key's shard is in its top bits). Called under the store's lock: quick,
// and never calls the store.
using SsdKeyFilter = std::function<bool(uint64_t key_hi)>;
// Receives the listed entries one region at a time, outside the store's
// lock; returning false stops the listing.
using SsdEntrySink = std::function<bool(const std::vector<SsdEntry>&)>;
// Told of entries the tier dropped by itself; see SetDropListener.
using SsdDropListener = std::function<void(const std::vector<SsdEntry>&)>;

enum class LendResult : uint8_t { kLent, kAlreadyStored, kRefused };
struct LendTerms {
  bool gather = false;          // write the bytes from where they are
  uint64_t max_lent_bytes = 0;  // refuse past this many bytes lent at once
  // With gather: at most this many of them gathered; past it, values are
  // lent for a copy (a gathered slot is held until its region is written).
  uint64_t max_gathered_bytes = UINT64_MAX;
};

class SsdStore {
 public:
  // Opens the files (creating them), then rebuilds the index: from the
  // checkpoint when it matches the geometry and format, else by scanning
  // every region; incompatible files start cold with a logged reason.
  static Result<std::unique_ptr<SsdStore>> Open(const SsdOptions& options,
                                                MetricsRegistry* metrics, Executor* executor);
  virtual ~SsdStore() = default;

  // Copies the value into a region buffer; it becomes readable at once and
  // durable when its region is flushed. When every buffer is being written
  // it waits up to insert_wait for one; returns false (and counts a drop)
  // when none frees up in time, the tier is offline, or the value is too
  // large. A key already stored keeps its first value.
  virtual bool Insert(const KeyId& key, const uint8_t* data, uint64_t size) = 0;
  // As Insert, but never waits: false (a counted drop) when no buffer has
  // room now. For callers holding another lock (DRAM eviction), which wait
  // with WaitForRoom before taking it.
  virtual bool TryInsert(const KeyId& key, const uint8_t* data, uint64_t size) = 0;
  // Demotion without a copy under the caller's lock: places a record for
  // the value, whose bytes stay at `data`, in a region buffer with room now
  // (never waits), and calls take() -- under the store's lock, once, only
  // when the record is placed -- for what keeps `data` unchanged until the
  // store no longer needs it. The store releases (destroys) that hold
  // without any lock of its own: copy mode, once the region's flush has
  // copied the bytes into the buffer; gather mode (terms.gather, for values
  // of 256 KiB and more at a 4 KiB-aligned address, while the gathered
  // bytes held stay within terms.max_gathered_bytes), once the region
  // write that sends them from `data` is done. The value is readable
  // at once, like an Insert's. kRefused (nothing taken): no room now, the
  // tier closing or offline, the value too large, or terms.max_lent_bytes
  // already lent; the caller may copy instead.
  virtual LendResult InsertLent(const KeyId& key, const uint8_t* data, uint64_t size,
                                const LendTerms& terms,
                                const std::function<std::shared_ptr<void>()>& take) = 0;
  // Waits up to insert_wait until an Insert of `size` bytes would find room
  // without waiting for a region write. False on timeout, or at once when
  // no directory is writable or the value could never be stored.
  virtual bool WaitForRoom(uint64_t size) = 0;
  // The size of the stored value, or NotFound.
  virtual Result<uint64_t> Lookup(const KeyId& key) const = 0;
  virtual bool Contains(const KeyId& key) const = 0;
  // Reads and verifies the value into dst (exactly `size` bytes, the size
  // Lookup gave). NotFound, Corruption (the entry is dropped), IOError (a
  // miss; the entry is dropped). Blocks on the device.
  virtual Status Read(const KeyId& key, uint8_t* dst, uint64_t size) = 0;
  // Drops the key and logs a tombstone (when a buffer has room now; never
  // waits) so a crash restart does not bring it back once that is written.
  virtual void Remove(const KeyId& key) = 0;
  // Writes out the partly filled region buffers and waits for all flushes.
  virtual Status Flush() = 0;
  // Flushes, writes the checkpoint, closes the files. Idempotent.
  virtual Status Close() = 0;

  // Lists the live entries whose key passes `want` with their full key ids
  // and sizes (the index keeps only tags: the ids come from the record
  // headers). One region at a time: the region's live records are picked
  // from the index under the lock, then the headers of a region on disk are
  // read outside it, in reads of at most 1 MiB, so inserts and reads go on
  // meanwhile. An outdated copy (the index points at a newer record) is
  // never listed, nor a record whose region was reclaimed during the read;
  // an entry inserted or removed while the listing runs may or may not be.
  // Blocks on the device: call it from a background thread. Returns the
  // number of entries listed.
  virtual uint64_t ListEntries(const SsdKeyFilter& want, const SsdEntrySink& sink) = 0;

  // Sets (null: clears) what is told of the entries the tier drops by
  // itself: the live records of a reclaimed region (but those re-inserted
  // as hot), and of a region lost to a failed write or an offline
  // directory -- not Remove, which the caller knows of. Full key ids come
  // from the records' headers, read (reclaimed regions) just before the
  // region's space is written again; a header that cannot be read then is
  // not reported, nor a key stored again since. Called from the flush path
  // (an executor thread, or Flush's caller), never under the store's lock,
  // one call at a time; it must not call SetDropListener. Returns only when
  // no call of the previous listener is running.
  virtual void SetDropListener(SsdDropListener listener) = 0;

  virtual SsdStats GetStats() const = 0;
};

}  // namespace kvpool
