// Start and clean shutdown of the SSD tier: superblock, checkpoint, scan.
//
// Start, per directory: read the superblock. Missing, another format
// version or another geometry: reinitialize (new uuid, every region free;
// old regions are then rejected by their uuid) and log why ("cold: ...").
// Else, if the superblock names a checkpoint, load it when its CRC, uuid and
// geometry match; else scan every region. Either way the superblock's
// checkpoint pointer is cleared (and synced) before any new write, so a
// crash later can never reuse a stale checkpoint.
//
// The scan reads each region whole (one large read) after checking its
// header, and walks the record headers, accepting those whose header CRC,
// offset, region sequence and incarnation match. Payload CRCs are not
// checked here but on every read (so "only records that verify are
// served" holds either way, and the scan runs at device read speed).
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/log.h"
#include "store/ssd/ssd_engine.h"

namespace kvpool::ssd {
namespace {

struct AlignedBuf {
  explicit AlignedBuf(uint64_t n)
      : n(AlignUp(std::max<uint64_t>(n, 1), kDeviceBlock)),
        p(AllocIoBuffer(this->n)) {
    KVPOOL_CHECK(p != nullptr);
    std::memset(p, 0, this->n);
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  uint64_t n;
  uint8_t* p;
};

std::string CheckpointPath(const Dir& d) { return d.dir + "/kvpool-ssd.ckpt"; }

}  // namespace

Status SsdEngine::WriteSuperblock(Dir& d, uint64_t ckpt_bytes, uint32_t ckpt_crc) {
  AlignedBuf b(kSuperblockBytes);
  Superblock sb{};
  sb.magic = kSuperblockMagic;
  sb.version = kSsdFormatVersion;
  sb.region_bytes = opts_.region_bytes;
  sb.region_count = regions_per_dir_;
  sb.file_bytes = file_bytes_;
  sb.uuid_hi = d.uuid_hi;
  sb.uuid_lo = d.uuid_lo;
  sb.ckpt_bytes = ckpt_bytes;
  sb.ckpt_crc = ckpt_crc;
  sb.crc = TrailerCrc(sb);
  std::memcpy(b.p, &sb, sizeof(sb));
  KVPOOL_RETURN_IF_ERROR(d.dev->Write(0, b.p, kSuperblockBytes));
  return d.dev->Sync();
}

Status SsdEngine::Start() {
  const uint64_t per_dir = opts_.capacity_bytes / opts_.dirs.size();
  regions_per_dir_ = static_cast<uint32_t>((per_dir - kSuperblockBytes) / opts_.region_bytes);
  file_bytes_ = kSuperblockBytes + regions_per_dir_ * opts_.region_bytes;
  for (uint32_t di = 0; di < opts_.dirs.size(); ++di) {
    auto d = std::make_unique<Dir>();
    d->dir = opts_.dirs[di];
    d->data_path = d->dir + "/kvpool-ssd.data";
    d->first_region = di * regions_per_dir_;
    d->regions.resize(regions_per_dir_);
    dirs_.push_back(std::move(d));
  }
  RegisterMetrics();
  std::vector<std::string> cold, how;
  for (uint32_t di = 0; di < dirs_.size(); ++di) {
    std::string reason, method;
    KVPOOL_RETURN_IF_ERROR(OpenDir(di, &reason, &method));
    if (!reason.empty()) cold.push_back(dirs_[di]->dir + ": " + reason);
    how.push_back(method);
  }
  FinishRecovery();
  if (cold.size() == dirs_.size()) {
    std::string r;
    for (auto& c : cold) r += (r.empty() ? "" : "; ") + c;
    recovery_ = "cold: " + r;
  } else if (std::find(how.begin(), how.end(), "scan") != how.end()) {
    recovery_ = "scan";
  } else {
    recovery_ = "checkpoint";
  }
  LogInfo("ssd: started with {} entries in {} dirs (recovery: {})", index_.size(), dirs_.size(),
          recovery_);
  return Status::Ok();
}

Status SsdEngine::OpenDir(uint32_t di, std::string* cold_reason, std::string* method) {
  Dir& d = *dirs_[di];
  ::mkdir(d.dir.c_str(), 0755);  // may exist; a real failure shows in the open
  auto dev = factory_(d.data_path, file_bytes_);
  if (!dev.ok()) {
    d.online = false;
    d.offline_reason = "cannot open: " + dev.status().ToString();
    *cold_reason = d.offline_reason;
    *method = "none";
    LogError("ssd: directory {} offline: {}", d.dir, d.offline_reason);
    return Status::Ok();
  }
  d.dev = std::move(dev).value();
  for (uint32_t ri = regions_per_dir_; ri-- > 0;) d.free_regions.push_back(ri);

  AlignedBuf b(kSuperblockBytes);
  Superblock sb{};
  Status st = d.dev->Read(0, b.p, kSuperblockBytes);
  if (st.ok()) std::memcpy(&sb, b.p, sizeof(sb));
  std::string reason;
  if (!st.ok()) {
    reason = "superblock unreadable: " + st.ToString();
  } else if (sb.magic != kSuperblockMagic) {
    reason = "new file";
  } else if (sb.version != kSsdFormatVersion) {
    reason = fmt::format("format version {} (this build writes {})", sb.version, kSsdFormatVersion);
    if (!opts_.wipe_other_format) {
      return FailedPrecondition(fmt::format(
          "ssd: {} holds an SSD tier of on-disk format version {}, which this build (format "
          "version {}) cannot read. Its entries are a cache: to start, remove {} and {}/"
          "kvpool-ssd.ckpt, or start once with --ssd-wipe-other-format, and the SSD tier "
          "starts empty (docs/operations.md, Upgrades)",
          d.dir, sb.version, kSsdFormatVersion, d.data_path, d.dir));
    }
  } else if (sb.crc != TrailerCrc(sb)) {
    reason = "superblock checksum mismatch";
  } else if (sb.region_bytes != opts_.region_bytes || sb.region_count != regions_per_dir_ ||
             sb.file_bytes != file_bytes_) {
    reason = fmt::format("geometry changed (region_bytes {} -> {}, regions {} -> {})",
                         sb.region_bytes, opts_.region_bytes, sb.region_count, regions_per_dir_);
  }
  if (!reason.empty()) {
    std::random_device rd;
    d.uuid_hi = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    d.uuid_lo = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (reason != "new file") LogWarn("ssd: {} starts cold: {}", d.dir, reason);
    Status ws = WriteSuperblock(d, 0, 0);
    if (!ws.ok()) TakeOffline(d, "cannot write superblock: " + ws.ToString());
    *cold_reason = reason;
    *method = "cold";
    return Status::Ok();
  }
  d.uuid_hi = sb.uuid_hi;
  d.uuid_lo = sb.uuid_lo;
  if (sb.ckpt_bytes > 0 && LoadCheckpoint(di, sb.ckpt_bytes, sb.ckpt_crc)) {
    *method = "checkpoint";
  } else {
    if (sb.ckpt_bytes > 0) LogWarn("ssd: checkpoint of {} unusable; scanning", d.dir);
    ScanDir(di);
    *method = "scan";
  }
  if (sb.ckpt_bytes > 0) {
    Status ws = WriteSuperblock(d, 0, 0);  // the checkpoint is stale from now on
    if (!ws.ok()) TakeOffline(d, "cannot write superblock: " + ws.ToString());
  }
  return Status::Ok();
}

bool SsdEngine::LoadCheckpoint(uint32_t di, uint64_t bytes, uint32_t crc) {
  Dir& d = *dirs_[di];
  const uint64_t want = sizeof(CheckpointHeader) + regions_per_dir_ * sizeof(CheckpointRegion);
  if (bytes < want) return false;
  auto dev = factory_(CheckpointPath(d), AlignUp(bytes, kDeviceBlock));
  if (!dev.ok()) return false;
  AlignedBuf b(bytes);
  if (!(*dev)->Read(0, b.p, b.n).ok() || crc32c::Value(b.p, bytes) != crc) return false;
  CheckpointHeader h;
  std::memcpy(&h, b.p, sizeof(h));
  if (h.magic != kCheckpointMagic || h.version != kSsdFormatVersion || h.crc != TrailerCrc(h) ||
      h.region_bytes != opts_.region_bytes || h.region_count != regions_per_dir_ ||
      h.uuid_hi != d.uuid_hi || h.uuid_lo != d.uuid_lo ||
      bytes != want + h.entries * sizeof(CheckpointEntry)) {
    return false;
  }
  const auto* regions = reinterpret_cast<const CheckpointRegion*>(b.p + sizeof(h));
  d.free_regions.clear();
  for (uint32_t ri = 0; ri < regions_per_dir_; ++ri) {
    Region& r = d.regions[ri];
    r.seq = regions[ri].seq;
    r.used = regions[ri].used;
    r.state = r.seq == 0 ? RegionState::kFree : RegionState::kOnDisk;
  }
  const uint8_t* e = b.p + want;
  for (uint64_t i = 0; i < h.entries; ++i, e += sizeof(CheckpointEntry)) {
    CheckpointEntry ce;
    std::memcpy(&ce, e, sizeof(ce));
    if (ce.region >= regions_per_dir_ || d.regions[ce.region].state != RegionState::kOnDisk ||
        ce.offset % kRecordAlign != 0 || ce.offset + RecordBytes(ce.length) > opts_.region_bytes) {
      continue;  // cannot happen with a matching CRC; never trust blindly
    }
    AddRecovered(di, ce.region, ce.key_hi, ce.offset, ce.length, ce.reads);
  }
  next_seq_ = std::max(next_seq_, h.next_seq);
  return true;
}

void SsdEngine::ScanDir(uint32_t di) {
  Dir& d = *dirs_[di];
  AlignedBuf b(opts_.region_bytes);
  for (uint32_t ri = 0; ri < regions_per_dir_; ++ri) {
    const uint64_t base = RegionOffset(ri);
    if (!d.dev->Read(base, b.p, kDeviceBlock).ok()) continue;
    RegionHeader rh;
    std::memcpy(&rh, b.p, sizeof(rh));
    if (rh.magic != kRegionMagic || rh.version != kSsdFormatVersion || rh.crc != TrailerCrc(rh) ||
        rh.file_offset != base || rh.uuid_hi != d.uuid_hi || rh.uuid_lo != d.uuid_lo ||
        rh.seq == 0) {
      continue;  // never written in this incarnation
    }
    if (!d.dev->Read(base, b.p, opts_.region_bytes).ok()) continue;
    Region& r = d.regions[ri];
    r.state = RegionState::kOnDisk;
    r.seq = rh.seq;
    uint64_t pos = kRegionHeaderBytes, end = pos;
    while (pos + kRecordHeaderBytes <= opts_.region_bytes) {
      RecordHeader h;
      std::memcpy(&h, b.p + pos, sizeof(h));
      if (RecordValidAt(h, pos, opts_.region_bytes, {base + pos, rh.seq, d.incarnation()})) {
        AddRecovered(di, ri, h.key_hi, pos, static_cast<uint32_t>(h.value_len), 0);
        pos += RecordBytes(h.value_len);
        end = pos;
      } else if (h.magic == kTombstoneMagic &&
                 TombstoneValidAt(h, {base + pos, rh.seq, d.incarnation()})) {
        AddTombstone(rh.seq, h.key_hi, pos);
        pos += kRecordHeaderBytes;
        end = pos;
      } else {
        // Padding, stale bytes, or a damaged header: look for the next
        // record rather than give up on the rest of the region.
        pos += kRecordAlign;
      }
    }
    r.used = end;
  }
}

void SsdEngine::AddRecovered(uint32_t di, uint32_t ri, uint64_t h, uint64_t offset, uint32_t len,
                             uint32_t reads) {
  Dir& d = *dirs_[di];
  Region& r = d.regions[ri];
  auto t = tombstones_.find(h);
  if (t != tombstones_.end() && t->second > std::make_pair(r.seq, offset)) return;  // removed
  IndexLoc old;
  if (index_.Find(h, &old)) {
    uint32_t odi;
    if (RegionOf(old.region, &odi).seq >= r.seq) return;  // a later copy is indexed
    index_.Erase(h);
  }
  index_.Insert(h, {d.first_region + ri, offset, len, reads});
  r.keys.push_back(h);
}

void SsdEngine::AddTombstone(uint64_t seq, uint64_t h, uint64_t offset) {
  const auto at = std::make_pair(seq, offset);
  auto [t, fresh] = tombstones_.try_emplace(h, at);
  if (!fresh && t->second < at) t->second = at;
  IndexLoc old;
  uint32_t odi;
  if (index_.Find(h, &old) &&
      std::make_pair(RegionOf(old.region, &odi).seq, static_cast<uint64_t>(old.offset)) < at) {
    index_.Erase(h);
  }
}

void SsdEngine::FinishRecovery() {
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>>().swap(tombstones_);
  for (auto& dp : dirs_) {
    Dir& d = *dp;
    if (d.dev == nullptr) continue;
    std::vector<uint32_t> used;
    d.free_regions.clear();
    for (uint32_t ri = 0; ri < regions_per_dir_; ++ri) {
      Region& r = d.regions[ri];
      r.keys.shrink_to_fit();
      if (r.state == RegionState::kOnDisk) {
        used.push_back(ri);
        next_seq_ = std::max(next_seq_, r.seq + 1);
      }
    }
    std::sort(used.begin(), used.end(),
              [&](uint32_t a, uint32_t b) { return d.regions[a].seq < d.regions[b].seq; });
    d.fifo.assign(used.begin(), used.end());
    // Free regions in the order they follow the newest one, so writing
    // continues sequentially through the file.
    const uint32_t start = used.empty() ? 0 : (used.back() + 1) % regions_per_dir_;
    for (uint32_t k = regions_per_dir_; k-- > 0;) {
      const uint32_t ri = (start + k) % regions_per_dir_;
      if (d.regions[ri].state == RegionState::kFree) d.free_regions.push_back(ri);
    }
  }
}

Status SsdEngine::WriteCheckpoint(uint32_t di) {
  Dir& d = *dirs_[di];
  std::vector<CheckpointEntry> entries;
  std::vector<CheckpointRegion> regions(regions_per_dir_, CheckpointRegion{0, 0});
  for (uint32_t ri = 0; ri < regions_per_dir_; ++ri) {
    const Region& r = d.regions[ri];
    if (r.state != RegionState::kOnDisk) continue;
    regions[ri] = {r.seq, r.used};
    for (uint64_t h : r.keys) {
      IndexLoc loc;
      if (index_.Find(h, &loc) && loc.region == d.first_region + ri) {
        entries.push_back({h, ri, static_cast<uint32_t>(loc.offset), loc.length, loc.reads});
      }
    }
  }
  CheckpointHeader h{};
  h.magic = kCheckpointMagic;
  h.version = kSsdFormatVersion;
  h.region_bytes = opts_.region_bytes;
  h.region_count = regions_per_dir_;
  h.uuid_hi = d.uuid_hi;
  h.uuid_lo = d.uuid_lo;
  h.entries = entries.size();
  h.next_seq = next_seq_;
  h.crc = TrailerCrc(h);
  const uint64_t bytes = sizeof(h) + regions.size() * sizeof(CheckpointRegion) +
                         entries.size() * sizeof(CheckpointEntry);
  AlignedBuf b(bytes);
  uint8_t* p = b.p;
  std::memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  std::memcpy(p, regions.data(), regions.size() * sizeof(CheckpointRegion));
  p += regions.size() * sizeof(CheckpointRegion);
  std::memcpy(p, entries.data(), entries.size() * sizeof(CheckpointEntry));
  const uint32_t crc = crc32c::Value(b.p, bytes);
  KVPOOL_ASSIGN_OR_RETURN(auto dev, factory_(CheckpointPath(d), b.n));
  KVPOOL_RETURN_IF_ERROR(dev->Write(0, b.p, b.n));
  KVPOOL_RETURN_IF_ERROR(dev->Sync());
  // Only now does the superblock point at it.
  return WriteSuperblock(d, bytes, crc);
}

Status SsdEngine::Close() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return Status::Ok();
  }
  Status st = Flush();
  std::unique_lock lock(mu_);
  if (closed_) return Status::Ok();
  closing_ = true;
  cv_.wait(lock, [&] { return running_ == 0; });
  for (uint32_t di = 0; di < dirs_.size(); ++di) {
    Dir& d = *dirs_[di];
    if (d.dev == nullptr || !d.online) continue;
    Status cs = WriteCheckpoint(di);
    if (!cs.ok()) {
      LogWarn("ssd: checkpoint of {} not written ({}); the next start scans", d.dir, cs.ToString());
      if (st.ok()) st = cs;
    }
  }
  closed_ = true;
  // Lent after the flush above, so never written: the slots go back.
  std::vector<std::shared_ptr<void>> unwritten = ReleaseAllLent();
  LogInfo("ssd: closed with {} entries", index_.size());
  lock.unlock();
  unwritten.clear();
  return st;
}

}  // namespace kvpool::ssd
