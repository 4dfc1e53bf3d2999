// Write, read, flush and eviction paths of the SSD tier. See ssd_engine.h
// for the locking rules and ssd_format.h for the bytes.
#include "store/ssd/ssd_engine.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace kvpool::ssd {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Region writes are retried this many times before the region is dropped;
// this many dropped regions in a row take the directory offline.
constexpr int kWriteAttempts = 3;
constexpr int kFailuresBeforeOffline = 2;
// A full disk pauses a directory's writes this long, then they are tried
// again (RELIABILITY A7: resume within 2 s of space being freed).
constexpr auto kNoSpaceRetry = std::chrono::milliseconds(1000);

double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

constexpr uint64_t kHugePage = 2ull << 20;

// Puts a lent record's bytes that the region buffer carries into it -- the
// whole payload (copy mode) or its last partial block (gather), then the
// zero padding to the record's end -- and its final header into *h.
void FillLent(const LentRecord& l, uint8_t* buf, const RecordExpect& at, RecordHeader* h) {
  uint8_t* payload = buf + l.offset + kRecordHeaderBytes;
  EncodeRecordHeader(l.key, l.data, l.length, at, h, kRecordMagic, l.gather ? nullptr : payload);
  if (l.gather) {
    const uint64_t body = AlignDown(l.length, kDeviceBlock);
    std::memcpy(payload + body, l.data + body, l.length - body);
  }
  std::memset(payload + l.length, 0, RecordBytes(l.length) - kRecordHeaderBytes - l.length);
}

// The smallest value InsertLent writes from where it lies (gather): up to a
// device block of padding before its header is then under 2 % of it.
constexpr uint64_t kGatherMinBytes = 256ull << 10;

// The per-thread aligned buffer O_DIRECT reads land in before the one copy
// into the caller's memory (whole huge pages: a 1 MiB value with its header
// needs more than 1 MiB anyway).
uint8_t* BounceBuffer(uint64_t n) {
  struct Buf {
    uint8_t* p = nullptr;
    uint64_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf b;
  if (b.n < n) {
    std::free(b.p);
    b.n = AlignUp(n, kHugePage);
    b.p = AllocIoBuffer(b.n);
    KVPOOL_CHECK(b.p != nullptr);
  }
  return b.p;
}

}  // namespace

uint8_t* AllocIoBuffer(uint64_t bytes) {
  const bool huge = bytes % kHugePage == 0;
  void* p = nullptr;
  if (posix_memalign(&p, huge ? kHugePage : kDeviceBlock, bytes) != 0) return nullptr;
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // advisory only
  return static_cast<uint8_t*>(p);
}

SsdEngine::SsdEngine(const SsdOptions& options, MetricsRegistry* metrics, Executor* executor)
    : opts_(options),
      factory_(options.device_factory ? options.device_factory : FileDeviceFactory()),
      owned_metrics_(metrics == nullptr ? std::make_unique<MetricsRegistry>() : nullptr),
      metrics_(metrics != nullptr ? metrics : owned_metrics_.get()),
      executor_(executor),
      clock_(options.clock != nullptr ? options.clock : SystemClock::Get()) {}

SsdEngine::~SsdEngine() {
  for (uint8_t* b : all_bufs_) std::free(b);
}

uint8_t* SsdEngine::AllocBuffer() {
  uint8_t* b = AllocIoBuffer(opts_.region_bytes);
  if (b != nullptr) all_bufs_.push_back(b);
  return b;
}

Region& SsdEngine::RegionOf(uint32_t global, uint32_t* di) {
  *di = global / regions_per_dir_;
  return dirs_[*di]->regions[global % regions_per_dir_];
}

bool SsdEngine::CanWrite(Dir& d) const {
  if (!d.online || d.dev == nullptr) return false;
  return !d.paused || clock_->Now() >= d.paused_until;
}

bool SsdEngine::HasRoom(const Dir& d, uint64_t rec) const {
  if (d.filling >= 0 && d.regions[d.filling].used + rec <= opts_.region_bytes) return true;
  const bool buffer = !d.free_bufs.empty() || d.bufs_allocated < opts_.buffers_per_dir;
  const bool region = !d.free_regions.empty() ||
                      (!d.fifo.empty() && d.regions[d.fifo.front()].state == RegionState::kOnDisk);
  return buffer && region;
}

bool SsdEngine::WaitForRoom(uint64_t size) {
  const uint64_t rec = RecordBytes(size);
  if (size > opts_.max_value_bytes || rec > opts_.region_bytes - kRegionHeaderBytes) return false;
  std::unique_lock lock(mu_);
  const auto deadline = SteadyClock::now() + opts_.insert_wait;
  while (true) {
    if (closing_) return false;
    bool writable = false;
    for (auto& d : dirs_) {
      if (!CanWrite(*d)) continue;
      writable = true;
      if (HasRoom(*d, rec)) return true;
    }
    // No room anywhere: a filling region too full for this record is done
    // (the next insert would seal it); seal it now so its write starts and
    // a buffer frees up.
    for (uint32_t di = 0; di < dirs_.size(); ++di) {
      Dir& d = *dirs_[di];
      if (CanWrite(d) && d.filling >= 0) Seal(di);
    }
    if (!writable || executor_ == nullptr ||
        cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return false;
    }
  }
}

bool SsdEngine::Insert(const KeyId& key, const uint8_t* data, uint64_t size, bool wait) {
  const uint64_t rec = RecordBytes(size);
  auto drop = [&] {
    inserts_dropped_.fetch_add(1, std::memory_order_relaxed);
    m_.inserts_dropped->Inc();
    return false;
  };
  if (size > opts_.max_value_bytes || size > UINT32_MAX ||
      rec > opts_.region_bytes - kRegionHeaderBytes) {
    return drop();
  }
  uint32_t di = 0, ri = 0;
  uint64_t off = 0, seq = 0;
  uint8_t* buf = nullptr;
  {
    std::unique_lock lock(mu_);
    // When every buffer is waiting for its write, wait (bounded) for one:
    // demotions then run at the device's speed instead of being dropped.
    const auto deadline = SteadyClock::now() + opts_.insert_wait;
    bool ok = false;
    while (true) {
      if (closing_) return drop();
      IndexLoc loc;
      if (index_.Find(key.hi, &loc)) return true;  // the first value stays
      bool writable = false;
      for (size_t i = 0; i < dirs_.size() && !ok; ++i) {
        di = rr_++ % dirs_.size();
        bool can = CanWrite(*dirs_[di]);
        writable = writable || can;
        ok = can && PrepareRegion(di, rec);
      }
      if (ok) break;
      if (!writable || !wait || executor_ == nullptr ||
          cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        return drop();
      }
    }
    Dir& d = *dirs_[di];
    ri = static_cast<uint32_t>(d.filling);
    Region& r = d.regions[ri];
    off = r.used;
    r.used += rec;
    ++r.writers;
    r.keys.push_back(key.hi);
    buf = r.buf;
    seq = r.seq;
  }
  // Fill the record outside the lock; `writers` keeps the buffer unflushed.
  Dir& d = *dirs_[di];
  RecordHeader h;
  EncodeRecordHeader(key, data, size, {RegionOffset(ri) + off, seq, d.incarnation()}, &h,
                     kRecordMagic, buf + off + kRecordHeaderBytes);
  std::memcpy(buf + off, &h, sizeof(h));
  std::memset(buf + off + kRecordHeaderBytes + size, 0, rec - kRecordHeaderBytes - size);
  {
    std::lock_guard lock(mu_);
    Region& r = d.regions[ri];
    // A concurrent insert of the same key may have won; its record stays
    // first and this one is dead space.
    index_.Insert(key.hi, {d.first_region + ri, off, static_cast<uint32_t>(size), 0});
    if (--r.writers == 0 && r.state == RegionState::kSealed) cv_.notify_all();
  }
  return true;
}

LendResult SsdEngine::InsertLent(const KeyId& key, const uint8_t* data, uint64_t size,
                                 const LendTerms& terms,
                                 const std::function<std::shared_ptr<void>()>& take) {
  const uint64_t rec = RecordBytes(size);
  const uint64_t room = opts_.region_bytes - kRegionHeaderBytes;
  if (size > opts_.max_value_bytes || size > UINT32_MAX || rec > room) {
    return LendResult::kRefused;
  }
  // A gather record's payload starts on a device block in the file, so the
  // write can take its whole blocks from `data`; the header sits just
  // before (up to a block of padding ahead of it, which recovery scans
  // over). Only for values large enough that the padding costs little.
  const bool gatherable = terms.gather && size >= kGatherMinBytes &&
                          reinterpret_cast<uintptr_t>(data) % kDeviceBlock == 0 &&
                          rec + kDeviceBlock <= room;
  std::lock_guard lock(mu_);
  if (closing_) return LendResult::kRefused;
  IndexLoc loc;
  if (index_.Find(key.hi, &loc)) return LendResult::kAlreadyStored;  // the first value stays
  if (lent_bytes_ + size > terms.max_lent_bytes) return LendResult::kRefused;
  // A gathered slot stays lent until its region is written. Past
  // terms.max_gathered_bytes held so, the value is lent for a copy
  // instead, which gives its slot back within a flush thread's job.
  const bool gather = gatherable && gathered_bytes_ + size <= terms.max_gathered_bytes;
  const uint64_t need = rec + (gather ? kDeviceBlock : 0);
  uint32_t di = 0;
  bool ok = false;
  for (size_t i = 0; i < dirs_.size() && !ok; ++i) {
    di = rr_++ % dirs_.size();
    ok = CanWrite(*dirs_[di]) && PrepareRegion(di, need);
  }
  if (!ok) return LendResult::kRefused;
  Dir& d = *dirs_[di];
  const uint32_t ri = static_cast<uint32_t>(d.filling);
  Region& r = d.regions[ri];
  const uint64_t off =
      gather ? AlignUp(r.used + kRecordHeaderBytes, kDeviceBlock) - kRecordHeaderBytes : r.used;
  std::memset(r.buf + r.used, 0, off - r.used);
  // A valid header now (readers of the buffer check the key by it); the
  // payload's CRC is filled in by the flush (PrepareLent).
  RecordHeader h;
  EncodeRecordHeader(key, nullptr, 0, {RegionOffset(ri) + off, r.seq, d.incarnation()}, &h);
  h.value_len = size;
  h.header_crc = crc32c::Value(&h, 60);
  std::memcpy(r.buf + off, &h, sizeof(h));
  r.used = off + rec;
  r.keys.push_back(key.hi);
  index_.Insert(key.hi, {d.first_region + ri, off, static_cast<uint32_t>(size), 0});
  r.lent.push_back({off, key, data, static_cast<uint32_t>(size), gather, false, take()});
  lent_bytes_ += size;
  if (gather) gathered_bytes_ += size;
  (gather ? m_.lent_gathered : m_.lent_copied)->Inc();
  if (!gather && !copy_queued_ && executor_ != nullptr) {
    copy_queued_ = true;
    executor_->Submit([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->CopyLent();
    });
  }
  return LendResult::kLent;
}

void SsdEngine::CopyLent() {
  struct Job {
    uint32_t di, ri;
    size_t i;      // in the region's lent list (appended to meanwhile, never reordered)
    LentRecord l;  // without the hold
    uint8_t* buf;
    uint64_t seq;
    RecordHeader h;
  };
  std::vector<Job> jobs;
  std::vector<std::pair<uint32_t, uint32_t>> held;  // regions whose writers count jobs hold
  std::unique_lock lock(mu_);
  copy_queued_ = false;
  if (abandoned_) return;
  ++running_;
  for (uint32_t di = 0; di < dirs_.size(); ++di) {
    Dir& d = *dirs_[di];
    auto take = [&](uint32_t ri) {
      Region& r = d.regions[ri];
      bool any = false;
      for (size_t i = 0; i < r.lent.size(); ++i) {
        LentRecord& l = r.lent[i];
        if (l.gather || l.data == nullptr || l.copying) continue;
        l.copying = true;
        jobs.push_back({di,
                        ri,
                        i,
                        {l.offset, l.key, l.data, l.length, false, true, nullptr},
                        r.buf,
                        r.seq,
                        {}});
        any = true;
      }
      if (any) {
        ++r.writers;  // the region's flush waits for these copies
        held.emplace_back(di, ri);
      }
    };
    if (d.filling >= 0) take(static_cast<uint32_t>(d.filling));
    for (uint32_t ri : d.flush_queue) take(ri);
  }
  lock.unlock();
  for (Job& j : jobs) {
    FillLent(j.l, j.buf, {RegionOffset(j.ri) + j.l.offset, j.seq, dirs_[j.di]->incarnation()},
             &j.h);
  }
  std::vector<std::shared_ptr<void>> copied;
  lock.lock();
  for (const Job& j : jobs) {
    LentRecord& l = dirs_[j.di]->regions[j.ri].lent[j.i];
    std::memcpy(j.buf + l.offset, &j.h, sizeof(RecordHeader));
    l.data = nullptr;  // readers take the buffer's copy from now on
    l.copying = false;
    lent_bytes_ -= l.length;
    copied.push_back(std::move(l.hold));
  }
  for (auto [di, ri] : held) {
    Region& r = dirs_[di]->regions[ri];
    if (--r.writers == 0 && r.state == RegionState::kSealed) cv_.notify_all();
  }
  --running_;
  cv_.notify_all();
  lock.unlock();
  copied.clear();  // the slots go back to their store
}

std::vector<std::shared_ptr<void>> SsdEngine::TakeLent(Region& r) {
  std::vector<std::shared_ptr<void>> holds;
  for (LentRecord& l : r.lent) {
    if (l.hold) {
      lent_bytes_ -= l.length;
      if (l.gather) gathered_bytes_ -= l.length;
      holds.push_back(std::move(l.hold));
    }
  }
  r.lent.clear();
  return holds;
}

const uint8_t* SsdEngine::BufferedPayload(const Region& r, uint64_t offset) const {
  auto it = std::lower_bound(r.lent.begin(), r.lent.end(), offset,
                             [](const LentRecord& l, uint64_t off) { return l.offset < off; });
  if (it != r.lent.end() && it->offset == offset && it->data != nullptr) return it->data;
  return r.buf + offset + kRecordHeaderBytes;
}

std::vector<Device::Piece> SsdEngine::PrepareLent(uint32_t di, uint32_t ri, uint64_t len,
                                                  std::unique_lock<std::mutex>& lock) {
  Dir& d = *dirs_[di];
  Region& r = d.regions[ri];
  if (r.lent.empty()) return {{r.buf, len}};
  // The list is final (the region is sealed) and only this flush changes
  // it until the write is done: read it without the lock.
  const std::vector<LentRecord>& lent = r.lent;
  uint8_t* const buf = r.buf;
  const uint64_t seq = r.seq;
  lock.unlock();
  std::vector<RecordHeader> headers(lent.size());
  std::vector<Device::Piece> pieces;
  uint64_t pos = 0;  // region bytes before it are in pieces
  for (size_t i = 0; i < lent.size(); ++i) {
    const LentRecord& l = lent[i];
    if (l.data == nullptr) continue;  // copied in already (CopyLent)
    FillLent(l, buf, {RegionOffset(ri) + l.offset, seq, d.incarnation()}, &headers[i]);
    if (l.gather) {
      const uint64_t body = AlignDown(l.length, kDeviceBlock);  // written from l.data
      pieces.push_back({buf + pos, l.offset + kRecordHeaderBytes - pos});
      pieces.push_back({l.data, body});
      pos = l.offset + kRecordHeaderBytes + body;
    }
  }
  pieces.push_back({buf + pos, len - pos});
  std::erase_if(pieces, [](const Device::Piece& p) { return p.len == 0; });
  std::vector<std::shared_ptr<void>> copied;
  lock.lock();
  for (size_t i = 0; i < r.lent.size(); ++i) {
    LentRecord& l = r.lent[i];
    if (l.data == nullptr) continue;
    std::memcpy(buf + l.offset, &headers[i], sizeof(RecordHeader));
    if (!l.gather) {
      l.data = nullptr;  // readers take the buffer's copy from now on
      lent_bytes_ -= l.length;
      copied.push_back(std::move(l.hold));
    }
  }
  lock.unlock();
  copied.clear();  // the slots go back to their store
  lock.lock();
  return pieces;
}

bool SsdEngine::PrepareRegion(uint32_t di, uint64_t bytes) {
  Dir& d = *dirs_[di];
  if (d.filling >= 0) {
    if (d.regions[d.filling].used + bytes <= opts_.region_bytes) return true;
    Seal(di);
  }
  uint8_t* buf = nullptr;
  if (!d.free_bufs.empty()) {
    buf = d.free_bufs.back();
    d.free_bufs.pop_back();
  } else if (d.bufs_allocated < opts_.buffers_per_dir && (buf = AllocBuffer()) != nullptr) {
    ++d.bufs_allocated;
  }
  if (buf == nullptr) return false;  // every buffer is waiting for its write
  if (d.free_regions.empty() && !ReclaimOldest(di)) {
    d.free_bufs.push_back(buf);
    return false;
  }
  const uint32_t ri = d.free_regions.back();
  d.free_regions.pop_back();
  Region& r = d.regions[ri];
  r.state = RegionState::kFilling;
  r.seq = next_seq_++;
  r.used = kRegionHeaderBytes;
  r.writers = 0;
  r.buf = buf;
  r.keys.clear();
  RegionHeader rh{};
  rh.magic = kRegionMagic;
  rh.version = kSsdFormatVersion;
  rh.seq = r.seq;
  rh.file_offset = RegionOffset(ri);
  rh.uuid_hi = d.uuid_hi;
  rh.uuid_lo = d.uuid_lo;
  rh.crc = TrailerCrc(rh);
  std::memcpy(buf, &rh, sizeof(rh));
  d.fifo.push_back(ri);
  d.filling = static_cast<int32_t>(ri);
  return true;
}

void SsdEngine::Seal(uint32_t di) {
  Dir& d = *dirs_[di];
  Region& r = d.regions[d.filling];
  r.state = RegionState::kSealed;
  r.keys.shrink_to_fit();  // the list is final: keep it at 8 B per record
  d.flush_queue.push_back(static_cast<uint32_t>(d.filling));
  d.filling = -1;
  ScheduleFlush(di);
}

void SsdEngine::ScheduleFlush(uint32_t di) {
  if (executor_ == nullptr) return;  // Flush() drains the queue inline
  executor_->Submit([weak = weak_from_this(), di] {
    auto self = weak.lock();
    if (!self) return;
    std::unique_lock lock(self->mu_);
    if (self->abandoned_ || self->dirs_[di]->flush_queue.empty()) return;
    ++self->running_;
    self->FlushOne(di, lock);
    --self->running_;
    self->cv_.notify_all();
  });
}

void SsdEngine::FlushOne(uint32_t di, std::unique_lock<std::mutex>& lock) {
  Dir& d = *dirs_[di];
  const uint32_t ri = d.flush_queue.front();
  d.flush_queue.pop_front();
  ++d.flushing;
  Region& r = d.regions[ri];
  cv_.wait(lock, [&] { return r.writers == 0; });
  // The records this region held before it was reclaimed are still on
  // disk: their headers are read (for the drop listener) before the write.
  std::vector<RecordRef> reclaimed;
  reclaimed.swap(r.reclaimed);
  if (!d.online) {
    // Nothing more is written to an offline directory; what was buffered
    // goes with it.
    std::vector<std::shared_ptr<void>> lost = TakeLent(r);
    lock.unlock();
    lost.clear();
    lock.lock();
    ReportDropped(DropRegion(di, ri), lock);
    --d.flushing;
    cv_.notify_all();
    return;
  }
  const uint64_t len = AlignUp(r.used, kDeviceBlock);
  std::memset(r.buf + r.used, 0, len - r.used);  // no stale bytes after the last record
  uint8_t* buf = r.buf;
  Device* dev = d.dev.get();
  const uint64_t reclaimed_seq = r.reclaimed_seq;
  const std::vector<Device::Piece> pieces = PrepareLent(di, ri, len, lock);
  lock.unlock();
  std::vector<RecordRef> dropped;
  if (!reclaimed.empty()) {
    ReadHeaders(d, ri, reclaimed_seq, reclaimed, BounceBuffer(kHeaderReadBytes), &dropped);
  }
  Status st;
  for (int attempt = 0; attempt < kWriteAttempts; ++attempt) {
    const auto t0 = SteadyClock::now();
    st = pieces.size() == 1 ? dev->Write(RegionOffset(ri), buf, len)
                            : dev->WriteV(RegionOffset(ri), pieces);
    m_.write_latency->Observe(SecondsSince(t0));
    if (st.ok() || st.code() == StatusCode::kResourceExhausted) break;
  }
  lock.lock();
  // The gather records' bytes are on disk, or lost with the region.
  std::vector<std::shared_ptr<void>> written = TakeLent(r);
  if (st.ok()) {
    r.state = RegionState::kOnDisk;
    r.buf = nullptr;
    d.free_bufs.push_back(buf);
    d.write_failures = 0;
    d.paused = false;
    writes_.fetch_add(1, std::memory_order_relaxed);
    write_bytes_.fetch_add(len, std::memory_order_relaxed);
    d.writes.fetch_add(1, std::memory_order_relaxed);
    m_.writes->Inc();
    m_.write_bytes->Inc(len);
    d.m.writes->Inc();
  } else {
    m_.write_errors->Inc();
    inserts_dropped_.fetch_add(r.keys.size(), std::memory_order_relaxed);
    m_.inserts_dropped->Inc(r.keys.size());
    std::vector<RecordRef> lost = DropRegion(di, ri);
    dropped.insert(dropped.end(), lost.begin(), lost.end());
    if (st.code() == StatusCode::kResourceExhausted) {
      if (!d.paused) LogWarn("ssd: {} is full ({}); pausing its writes", d.dir, st.ToString());
      d.paused = true;
      d.paused_until = clock_->Now() + kNoSpaceRetry;
    } else if (++d.write_failures >= kFailuresBeforeOffline) {
      TakeOffline(d, "persistent write failure: " + st.ToString());
    } else {
      LogWarn("ssd: region write to {} failed ({}); region dropped", d.dir, st.ToString());
    }
  }
  lock.unlock();
  written.clear();  // the slots go back to their store
  lock.lock();
  // Reported before the flush counts as done, so Flush() returns after it.
  ReportDropped(dropped, lock);
  --d.flushing;
  cv_.notify_all();
}

void SsdEngine::TakeOffline(Dir& d, std::string reason) {
  if (!d.online) return;
  d.online = false;
  d.offline_reason = std::move(reason);
  LogError("ssd: directory {} offline: {}", d.dir, d.offline_reason);
  // The filling region can never be written now; let the flush path drop it.
  for (uint32_t di = 0; di < dirs_.size(); ++di) {
    if (dirs_[di].get() == &d && d.filling >= 0) Seal(di);
  }
}

std::vector<RecordRef> SsdEngine::DropRegion(uint32_t di, uint32_t ri) {
  Dir& d = *dirs_[di];
  Region& r = d.regions[ri];
  const uint32_t global = d.first_region + ri;
  std::vector<RecordRef> lost;
  for (uint64_t h : r.keys) {
    IndexLoc loc;
    if (report_drops_ && r.buf != nullptr && index_.Find(h, &loc) && loc.region == global) {
      RecordRef t{loc.offset, h, loc.length};
      RecordHeader rh;
      std::memcpy(&rh, r.buf + loc.offset, sizeof(rh));
      const RecordExpect at{RegionOffset(ri) + loc.offset, r.seq, d.incarnation()};
      if (t.Matches(rh, opts_.region_bytes, at)) {
        t.key_lo = rh.key_lo;
        lost.push_back(t);
      }
    }
    index_.EraseIfIn(h, global);
  }
  std::vector<uint64_t>().swap(r.keys);
  if (r.buf != nullptr) d.free_bufs.push_back(r.buf);
  r.buf = nullptr;
  r.state = RegionState::kFree;
  r.used = 0;
  if (d.filling == static_cast<int32_t>(ri)) d.filling = -1;
  auto it = std::find(d.fifo.begin(), d.fifo.end(), ri);
  if (it != d.fifo.end()) d.fifo.erase(it);
  d.free_regions.push_back(ri);
  return lost;
}

bool SsdEngine::ReclaimOldest(uint32_t di) {
  Dir& d = *dirs_[di];
  if (d.fifo.empty()) return false;
  const uint32_t ri = d.fifo.front();
  Region& r = d.regions[ri];
  if (r.state != RegionState::kOnDisk) return false;  // oldest is still being written
  d.fifo.pop_front();
  const uint32_t global = d.first_region + ri;
  std::vector<Reinsert> hot;
  std::vector<RecordRef> gone;
  for (uint64_t h : r.keys) {
    IndexLoc loc;
    const bool live = index_.Find(h, &loc) && loc.region == global;
    if (live && opts_.reinsert_min_reads > 0 && loc.reads >= opts_.reinsert_min_reads) {
      hot.push_back({di, RegionOffset(ri) + loc.offset, r.seq, loc.length});
    } else if (live && report_drops_) {
      gone.push_back({loc.offset, h, loc.length});
    }
    index_.EraseIfIn(h, global);
  }
  std::vector<uint64_t>().swap(r.keys);
  // Reading the headers of many small records before the region is
  // rewritten would cost about a region's read per reclaim and slow the
  // flushes: past one record per kHeaderMergeGap they are not reported (their
  // directory entries stay until a reader's fetch of them fails).
  if (gone.size() > opts_.region_bytes / kHeaderMergeGap) {
    m_.dropped_unreported->Inc(gone.size());
    gone.clear();
  }
  // The region is written again only by its next flush, which reads these
  // headers first (FlushOne).
  std::sort(gone.begin(), gone.end(),
            [](const RecordRef& a, const RecordRef& b) { return a.offset < b.offset; });
  r.reclaimed = std::move(gone);
  r.reclaimed_seq = r.seq;
  r.state = RegionState::kFree;
  r.used = 0;
  d.free_regions.push_back(ri);
  region_evictions_.fetch_add(1, std::memory_order_relaxed);
  m_.region_evictions->Inc();
  if (!hot.empty()) {
    // The old bytes stay on disk until the region's next flush; read them
    // back from there (a job, not under mu_) and insert them again.
    reinsert_queue_.push_back(std::move(hot));
    if (executor_ != nullptr) {
      executor_->Submit([weak = weak_from_this()] {
        auto self = weak.lock();
        if (self) self->RunOneReinsertJob();
      });
    }
  }
  return true;
}

void SsdEngine::RunOneReinsertJob() {
  std::vector<Reinsert> items;
  {
    std::lock_guard lock(mu_);
    if (abandoned_ || reinsert_queue_.empty()) return;
    items = std::move(reinsert_queue_.front());
    reinsert_queue_.pop_front();
    ++reinserting_;
    ++running_;
  }
  for (const Reinsert& it : items) {
    Dir& d = *dirs_[it.dir];
    const uint64_t start = AlignDown(it.file_offset, kDeviceBlock);
    const uint64_t end = AlignUp(it.file_offset + kRecordHeaderBytes + it.length, kDeviceBlock);
    uint8_t* b = BounceBuffer(end - start);
    if (!d.dev->Read(start, b, end - start).ok()) continue;
    RecordHeader h;
    std::memcpy(&h, b + (it.file_offset - start), sizeof(h));
    const uint8_t* payload = b + (it.file_offset - start) + kRecordHeaderBytes;
    // The region may have been rewritten meanwhile: then the header names
    // another sequence and the record is simply gone.
    if (!HeaderValidAt(h, {it.file_offset, it.seq, d.incarnation()}) ||
        h.value_len != it.length || !PayloadValid(h, payload)) {
      continue;
    }
    Insert(KeyId{h.key_hi, h.key_lo}, payload, h.value_len, /*wait=*/true);
  }
  std::lock_guard lock(mu_);
  --reinserting_;
  --running_;
  cv_.notify_all();
}

Result<uint64_t> SsdEngine::Lookup(const KeyId& key) const {
  std::lock_guard lock(mu_);
  IndexLoc loc;
  if (closed_ || !index_.Find(key.hi, &loc)) return NotFound("ssd: not cached");
  return static_cast<uint64_t>(loc.length);
}

void SsdEngine::Remove(const KeyId& key) {
  std::lock_guard lock(mu_);
  IndexLoc loc;
  if (!index_.Find(key.hi, &loc)) return;
  index_.Erase(key.hi);
  // Logged in the record's own directory: its region is older there, so it
  // is reclaimed before the tombstone's (a crash then cannot revive it).
  if (!closing_) LogTombstone(loc.region / regions_per_dir_, key);
}

bool SsdEngine::LogTombstone(uint32_t di, const KeyId& key) {
  Dir& d = *dirs_[di];
  if (!CanWrite(d) || !PrepareRegion(di, kRecordHeaderBytes)) return false;
  const uint32_t ri = static_cast<uint32_t>(d.filling);
  Region& r = d.regions[ri];
  RecordHeader h;
  EncodeTombstone(key, {RegionOffset(ri) + r.used, r.seq, d.incarnation()}, &h);
  std::memcpy(r.buf + r.used, &h, sizeof(h));
  r.used += kRecordHeaderBytes;
  return true;
}

Status SsdEngine::Read(const KeyId& key, uint8_t* dst, uint64_t size) {
  IndexLoc loc;
  uint32_t di = 0;
  uint64_t seq = 0, file_off = 0;
  Device* dev = nullptr;
  {
    std::lock_guard lock(mu_);
    if (closed_) return Unavailable("ssd: closed");
    if (!index_.Find(key.hi, &loc)) return NotFound("ssd: not cached");
    if (loc.length != size) return InvalidArgument("ssd: size differs from Lookup");
    Region& r = RegionOf(loc.region, &di);
    index_.BumpReads(key.hi);
    if (r.buf != nullptr) {
      // Still in its region buffer (filling or being written): from memory.
      RecordHeader h;
      std::memcpy(&h, r.buf + loc.offset, sizeof(h));
      if (h.key_hi != key.hi || h.key_lo != key.lo) return NotFound("ssd: index tag collision");
      std::memcpy(dst, BufferedPayload(r, loc.offset), size);
      reads_.fetch_add(1, std::memory_order_relaxed);
      read_bytes_.fetch_add(size, std::memory_order_relaxed);
      return Status::Ok();
    }
    seq = r.seq;
    file_off = RegionOffset(loc.region % regions_per_dir_) + loc.offset;
    dev = dirs_[di]->dev.get();
  }
  Dir& d = *dirs_[di];
  const uint64_t start = AlignDown(file_off, kDeviceBlock);
  const uint64_t end = AlignUp(file_off + kRecordHeaderBytes + size, kDeviceBlock);
  uint8_t* b = BounceBuffer(end - start);
  const auto t0 = SteadyClock::now();
  Status st = dev->Read(start, b, end - start);
  m_.read_latency->Observe(SecondsSince(t0));
  // Drops the entry if it still names this record (not a newer one).
  auto drop_entry = [&] {
    uint32_t unused;
    if (RegionOf(loc.region, &unused).seq != seq) return false;  // reclaimed meanwhile
    index_.EraseIfAt(key.hi, loc.region, loc.offset);
    return true;
  };
  if (!st.ok()) {
    std::lock_guard lock(mu_);
    m_.read_errors->Inc();
    drop_entry();
    return st.code() == StatusCode::kIOError ? st : IOError(st.ToString());
  }
  RecordHeader h;
  std::memcpy(&h, b + (file_off - start), sizeof(h));
  const uint8_t* payload = b + (file_off - start) + kRecordHeaderBytes;
  const bool header_ok = HeaderValidAt(h, {file_off, seq, d.incarnation()});
  if (header_ok && (h.key_hi != key.hi || h.key_lo != key.lo)) {
    // An intact record of another key whose tag matches: a miss, and the
    // entry stays (it is that key's).
    return NotFound("ssd: index tag collision");
  }
  if (!header_ok || h.value_len != size || !PayloadValid(h, payload)) {
    std::lock_guard lock(mu_);
    if (!drop_entry()) return NotFound("ssd: region reclaimed during read");
    crc_failures_.fetch_add(1, std::memory_order_relaxed);
    m_.crc_failures->Inc();
    LogWarn("ssd: record for {} at {}:{} failed verification; dropped", key.ToHex(), d.dir,
            file_off);
    return Corruption("ssd: record failed verification");
  }
  std::memcpy(dst, payload, size);
  reads_.fetch_add(1, std::memory_order_relaxed);
  read_bytes_.fetch_add(size, std::memory_order_relaxed);
  d.reads.fetch_add(1, std::memory_order_relaxed);
  m_.reads->Inc();
  m_.read_bytes->Inc(size);
  d.m.reads->Inc();
  return Status::Ok();
}

Status SsdEngine::Flush() {
  std::unique_lock lock(mu_);
  if (closed_) return Status::Ok();
  // Re-inserts add records: finish them first (inline if the executor has
  // not got to them; it may have been stopped).
  while (!reinsert_queue_.empty()) {
    lock.unlock();
    RunOneReinsertJob();
    lock.lock();
  }
  cv_.wait(lock, [&] { return reinserting_ == 0; });
  for (uint32_t di = 0; di < dirs_.size(); ++di) {
    Dir& d = *dirs_[di];
    if (d.filling >= 0 && d.regions[d.filling].used > kRegionHeaderBytes) Seal(di);
  }
  for (uint32_t di = 0; di < dirs_.size(); ++di) {
    while (!dirs_[di]->flush_queue.empty()) FlushOne(di, lock);
  }
  cv_.wait(lock, [&] {
    for (auto& d : dirs_) {
      if (d->flushing > 0 || !d->flush_queue.empty()) return false;
    }
    return true;
  });
  std::vector<Device*> devs;
  for (auto& d : dirs_) {
    if (d->online && d->dev) devs.push_back(d->dev.get());
  }
  lock.unlock();
  Status first;
  for (Device* dev : devs) {
    Status st = dev->Sync();
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

void SsdEngine::Abandon() {
  std::unique_lock lock(mu_);
  abandoned_ = true;
  closing_ = true;
  cv_.wait(lock, [&] { return running_ == 0; });
  std::vector<std::shared_ptr<void>> lost = ReleaseAllLent();
  lock.unlock();
  lost.clear();  // unwritten: the slots go back to their store
  metrics_->RemoveCallbacks(this);
}

std::vector<std::shared_ptr<void>> SsdEngine::ReleaseAllLent() {
  std::vector<std::shared_ptr<void>> holds;
  for (auto& d : dirs_) {
    for (Region& r : d->regions) {
      for (auto& h : TakeLent(r)) holds.push_back(std::move(h));
    }
  }
  return holds;
}

SsdStats SsdEngine::GetStats() const {
  std::lock_guard lock(mu_);
  SsdStats s;
  s.entries = index_.size();
  uint64_t list_bytes = 0, list_entries = 0;
  bool any_online = false;
  std::string reasons;
  for (const auto& d : dirs_) {
    SsdDirStats ds;
    ds.dir = d->dir;
    ds.device_kind = d->dev ? d->dev->kind() : "none";
    ds.capacity_bytes = static_cast<uint64_t>(d->regions.size()) * opts_.region_bytes;
    for (const Region& r : d->regions) {
      if (r.state != RegionState::kFree) ds.used_bytes += r.used;
      list_bytes += r.keys.capacity() * sizeof(uint64_t);
      list_entries += r.keys.size();
    }
    ds.reads = d->reads.load();
    ds.writes = d->writes.load();
    ds.online = d->online && d->dev != nullptr && !closed_;
    any_online |= ds.online;
    if (!ds.online && !d->offline_reason.empty()) {
      reasons += (reasons.empty() ? "" : "; ") + d->dir + ": " + d->offline_reason;
    }
    s.capacity_bytes += ds.capacity_bytes;
    s.used_bytes += ds.used_bytes;
    s.dirs.push_back(std::move(ds));
  }
  const uint64_t region_meta = regions_per_dir_ * dirs_.size() * sizeof(Region);
  s.index_bytes = index_.bytes() + list_bytes + region_meta;
  // Per entry at the table's highest load: 16 B / 0.8, plus the 8-byte key
  // in its region's list; the per-region records are a fixed cost in
  // index_bytes.
  s.index_bytes_per_entry =
      static_cast<double>(index_.bytes()) / (SsdIndex::kMaxLoad * index_.slots()) +
      (list_entries > 0 ? static_cast<double>(list_bytes) / list_entries : 8.0);
  s.reads = reads_.load();
  s.read_bytes = read_bytes_.load();
  s.writes = writes_.load();
  s.write_bytes = write_bytes_.load();
  s.crc_failures = crc_failures_.load();
  s.region_evictions = region_evictions_.load();
  s.inserts_dropped = inserts_dropped_.load();
  s.lent_bytes = lent_bytes_;
  s.online = any_online;
  s.offline_reason = closed_ ? "closed" : (any_online ? "" : reasons);
  s.recovery = recovery_;
  return s;
}

}  // namespace kvpool::ssd
