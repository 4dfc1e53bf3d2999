// SsdEngine: the implementation behind SsdStore (ssd_store.h), internal to
// src/store/ssd. ssd_engine.cc holds the write/read/flush/eviction paths,
// ssd_recovery.cc the superblock, checkpoint and region scan.
//
// Locking: one mutex (mu_) guards the index, every Region and Dir field not
// marked otherwise; device I/O and payload copies run outside it. A record
// is reserved in a region buffer under mu_, filled outside it (the region's
// `writers` count keeps the buffer from being flushed meanwhile), then
// published in the index under mu_. Insert(wait=false) (TryInsert, the
// demotion path under the DRAM lock) never blocks on a region write;
// WaitForRoom is where callers wait instead, before taking their lock.
//
// Lifetime: SsdStore owns the engine through a shared_ptr; executor tasks
// hold a weak_ptr and return at once when the engine is gone or closing, so
// a store can be dropped (a simulated kill) while tasks are still queued.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/executor.h"
#include "common/metrics.h"
#include "store/ssd/ssd_format.h"
#include "store/ssd/ssd_index.h"
#include "store/ssd/ssd_store.h"

namespace kvpool::ssd {

enum class RegionState : uint8_t {
  kFree,
  kFilling,  // the dir's current region: inserts append to its buffer
  kSealed,   // full: queued for its flush or being written
  kOnDisk,   // written; buffer released
};

// A record the index points at: where it is and whose it is (key_hi from
// memory; key_lo once its header has been read and checked).
struct RecordRef {
  uint64_t offset = 0;  // of the record header inside its region
  uint64_t key_hi = 0;
  uint32_t length = 0;  // value bytes
  uint64_t key_lo = 0;

  // True when h is this record, intact where the index says.
  bool Matches(const RecordHeader& h, uint64_t region_bytes, const RecordExpect& at) const {
    return RecordValidAt(h, offset, region_bytes, at) && h.key_hi == key_hi &&
           h.value_len == length;
  }
};

// Headers are read in chunks of at most this many bytes; headers closer
// than kHeaderMergeGap share a read (the gap costs less than a request).
inline constexpr uint64_t kHeaderReadBytes = 1ull << 20;
inline constexpr uint64_t kHeaderMergeGap = 64ull << 10;

// A record whose payload stays in the writer's memory (InsertLent) until
// the region's flush copies it in (copy) or writes it from there (gather).
struct LentRecord {
  uint64_t offset = 0;  // of the record header in the region
  KeyId key;
  const uint8_t* data = nullptr;  // null once copied into the buffer
  uint32_t length = 0;
  bool gather = false;         // payload 4 KiB-aligned in the file, written from data
  bool copying = false;        // a CopyLent job is copying it now
  std::shared_ptr<void> hold;  // keeps data valid; released without mu_
};

struct Region {
  RegionState state = RegionState::kFree;
  uint64_t seq = 0;
  uint64_t used = 0;      // bytes: header + records
  uint32_t writers = 0;   // inserts still copying into buf
  uint8_t* buf = nullptr; // region_bytes, 4 KiB-aligned (kFilling, kSealed)
  // KeyId::hi of every record in the region, for reclamation (8 B/record).
  std::vector<uint64_t> keys;
  // With a drop listener: the live records of the contents this region had
  // when it was reclaimed (sequence reclaimed_seq), whose headers are read
  // before the region is written again (FlushOne), then reported.
  std::vector<RecordRef> reclaimed;
  uint64_t reclaimed_seq = 0;
  // Records lent by InsertLent, by offset (kFilling, kSealed).
  std::vector<LentRecord> lent;
};

struct DirMetrics {
  Counter* reads = nullptr;
  Counter* writes = nullptr;
};

struct Dir {
  std::string dir;
  std::string data_path;
  std::unique_ptr<Device> dev;  // null when the file could not be opened
  uint64_t uuid_hi = 0, uuid_lo = 0;
  uint32_t first_region = 0;    // global number of this dir's region 0
  std::vector<Region> regions;
  std::deque<uint32_t> fifo;    // non-free regions, oldest seq first
  std::vector<uint32_t> free_regions;
  std::vector<uint8_t*> free_bufs;
  uint32_t bufs_allocated = 0;
  int32_t filling = -1;
  std::deque<uint32_t> flush_queue;
  uint32_t flushing = 0;        // flushes taken off the queue, not done
  bool online = true;
  std::string offline_reason;
  int write_failures = 0;       // consecutive failed region writes
  // A write found the disk full: no inserts here until this time.
  Clock::time_point paused_until{};  // by SsdEngine::clock_
  bool paused = false;
  std::atomic<uint64_t> reads{0}, writes{0};
  DirMetrics m;

  uint32_t incarnation() const { return static_cast<uint32_t>(uuid_lo); }
};

// Memory for O_DIRECT I/O, 4 KiB-aligned; free with std::free, null when
// out of memory. A size that is a multiple of 2 MiB is 2 MiB-aligned and
// advised onto transparent huge pages (where the kernel allows, madvise
// mode): an I/O then pins a few large pages, and a virtual disk gets far
// fewer segments per request (twice the throughput on the development VM,
// for kvpool and fio alike).
uint8_t* AllocIoBuffer(uint64_t bytes);

class SsdEngine : public std::enable_shared_from_this<SsdEngine> {
 public:
  SsdEngine(const SsdOptions& options, MetricsRegistry* metrics, Executor* executor);
  ~SsdEngine();

  // Opens the files and rebuilds the index (ssd_recovery.cc).
  Status Start();
  // Stops background work without writing anything more (a kill).
  void Abandon();

  // wait: when no buffer has room, wait up to insert_wait for a flush.
  bool Insert(const KeyId& key, const uint8_t* data, uint64_t size, bool wait);
  LendResult InsertLent(const KeyId& key, const uint8_t* data, uint64_t size,
                        const LendTerms& terms, const std::function<std::shared_ptr<void>()>& take);
  bool WaitForRoom(uint64_t size);
  Result<uint64_t> Lookup(const KeyId& key) const;
  Status Read(const KeyId& key, uint8_t* dst, uint64_t size);
  void Remove(const KeyId& key);
  Status Flush();
  Status Close();
  SsdStats GetStats() const;
  // SsdStore::ListEntries (ssd_list.cc).
  uint64_t ListEntries(const SsdKeyFilter& want, const SsdEntrySink& sink);
  void SetDropListener(SsdDropListener listener);

 private:
  struct Metrics {
    Counter *reads, *read_bytes, *writes, *write_bytes, *crc_failures, *region_evictions,
        *inserts_dropped, *read_errors, *write_errors, *list_entries, *list_read_bytes,
        *dropped_reported, *dropped_unreported, *lent_copied, *lent_gathered;
    Histogram *read_latency, *write_latency, *list_seconds;
  };
  struct Reinsert {
    uint32_t dir;
    uint64_t file_offset;
    uint64_t seq;
    uint32_t length;
  };

  // --- write path (ssd_engine.cc) ---
  bool CanWrite(Dir& d) const;
  // True when PrepareRegion(di, rec) would succeed now. REQUIRES: mu_ held.
  bool HasRoom(const Dir& d, uint64_t rec) const;
  // Makes the dir's filling region fit `bytes` more; false if it cannot.
  bool PrepareRegion(uint32_t di, uint64_t bytes);
  void Seal(uint32_t di);
  // Runs one queued flush of dir di. REQUIRES: lock holds mu_.
  void FlushOne(uint32_t di, std::unique_lock<std::mutex>& lock);
  void ScheduleFlush(uint32_t di);
  bool ReclaimOldest(uint32_t di);
  // Drops a region and its index entries (a failed write); returns its live
  // records, from its buffer, when a drop listener is set.
  std::vector<RecordRef> DropRegion(uint32_t di, uint32_t ri);
  // Tells the drop listener of those refs whose keys the index no longer
  // has, with mu_ released for the call. REQUIRES: lock holds mu_.
  void ReportDropped(const std::vector<RecordRef>& refs, std::unique_lock<std::mutex>& lock);
  void TakeOffline(Dir& d, std::string reason);
  // Gives up the region's lent records: their holds, to be released by the
  // caller without mu_. REQUIRES: mu_ held.
  std::vector<std::shared_ptr<void>> TakeLent(Region& r);
  // Fills in the lent records' payload CRCs (and copies the copy-mode ones
  // into the buffer) before the region write, without mu_ for the passes
  // over the bytes; the copied records' holds are released. Returns the
  // pieces of the region write: the buffer, and the gather records' bytes
  // where they lie. REQUIRES: lock holds mu_; the region sealed, no writers.
  std::vector<Device::Piece> PrepareLent(uint32_t di, uint32_t ri, uint64_t len,
                                         std::unique_lock<std::mutex>& lock);
  // Copies the copy-mode lent records of the filling and sealed regions
  // into their buffers and releases their holds (an executor job, queued
  // by InsertLent): a lent slot goes back within a job's latency, not when
  // its region fills.
  void CopyLent();
  // Every region's lent holds (a close or a kill). REQUIRES: mu_ held.
  std::vector<std::shared_ptr<void>> ReleaseAllLent();
  // Where a buffered record's payload is now. REQUIRES: mu_ held.
  const uint8_t* BufferedPayload(const Region& r, uint64_t offset) const;
  // Appends a tombstone for key to dir di's filling region (never waits;
  // false when there is no room now: the removal is then not logged).
  bool LogTombstone(uint32_t di, const KeyId& key);
  // Reads back one batch of hot records of reclaimed regions and inserts
  // them again (an executor task, or inline from Flush).
  void RunOneReinsertJob();
  uint8_t* AllocBuffer();

  // --- listing (ssd_list.cc) ---
  // The live records of global region `global` that pass want, by offset.
  // REQUIRES: mu_ held.
  std::vector<RecordRef> ListTargets(uint32_t global, const SsdKeyFilter& want);
  // Reads the headers of refs (sorted by offset) in region ri of dir di as
  // written in sequence seq, without mu_, into buf (kHeaderReadBytes); adds
  // those that check out, key_lo filled in, to *found. Returns bytes read.
  uint64_t ReadHeaders(const Dir& d, uint32_t ri, uint64_t seq, const std::vector<RecordRef>& refs,
                       uint8_t* buf, std::vector<RecordRef>* found);

  // --- recovery (ssd_recovery.cc) ---
  // Sets *cold_reason when the dir starts empty, *method to how it recovered.
  // FailedPrecondition: the directory holds another format version and
  // opts_.wipe_other_format is off (the store does not open).
  Status OpenDir(uint32_t di, std::string* cold_reason, std::string* method);
  Status WriteSuperblock(Dir& d, uint64_t ckpt_bytes, uint32_t ckpt_crc);
  bool LoadCheckpoint(uint32_t di, uint64_t ckpt_bytes, uint32_t ckpt_crc);
  void ScanDir(uint32_t di);
  Status WriteCheckpoint(uint32_t di);
  // Adds a recovered record; a later region seq wins for a duplicate key.
  void AddRecovered(uint32_t di, uint32_t ri, uint64_t h, uint64_t offset, uint32_t len,
                    uint32_t reads);
  // A tombstone found by the scan: drops h's earlier record, and later
  // AddRecovered calls skip records it outdates.
  void AddTombstone(uint64_t seq, uint64_t h, uint64_t offset);
  void FinishRecovery();
  void RegisterMetrics();

  uint64_t RegionOffset(uint32_t ri) const { return kSuperblockBytes + ri * opts_.region_bytes; }
  Region& RegionOf(uint32_t global, uint32_t* di);

  const SsdOptions opts_;
  DeviceFactory factory_;
  std::unique_ptr<MetricsRegistry> owned_metrics_;
  MetricsRegistry* const metrics_;
  Executor* const executor_;
  const Clock* const clock_;  // the full-disk pause's
  uint32_t regions_per_dir_ = 0;
  uint64_t file_bytes_ = 0;
  Metrics m_{};

  mutable std::mutex mu_;
  std::condition_variable cv_;  // writers drained, flushes done, jobs done
  SsdIndex index_;
  std::vector<std::unique_ptr<Dir>> dirs_;
  uint64_t next_seq_ = 1;
  uint32_t rr_ = 0;
  std::deque<std::vector<Reinsert>> reinsert_queue_;
  uint32_t reinserting_ = 0;    // reinsert jobs running
  bool closing_ = false;        // Close/Abandon began: no new inserts
  bool abandoned_ = false;      // dropped without Close: tasks return at once
  bool closed_ = false;
  uint32_t running_ = 0;        // executor tasks inside the engine
  std::string recovery_;
  // During recovery only: key_hi -> position (region seq, offset) of its
  // newest tombstone.
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> tombstones_;
  std::vector<uint8_t*> all_bufs_;
  bool report_drops_ = false;      // protected by mu_: a drop listener is set
  uint64_t lent_bytes_ = 0;        // payload bytes of lent records not yet released
  uint64_t gathered_bytes_ = 0;    // of which gather records'
  bool copy_queued_ = false;       // a CopyLent job is queued and has not started

  std::mutex listener_mu_;         // held while the drop listener runs
  SsdDropListener drop_listener_;  // protected by listener_mu_

  // Plain counters for SsdStats (the registry's may be shared by stores).
  std::atomic<uint64_t> reads_{0}, read_bytes_{0}, writes_{0}, write_bytes_{0}, crc_failures_{0},
      region_evictions_{0}, inserts_dropped_{0};
};

}  // namespace kvpool::ssd
