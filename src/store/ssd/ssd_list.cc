// Listing the SSD tier's entries with their full key ids
// (SsdStore::ListEntries), for a cluster node to tell the keys' homes what
// it holds.
//
// Memory knows which records are live and wanted: each region lists the
// KeyId::hi of its records, and the index says whether it points at that
// record. The full key id is only in the record header, so a listing walks
// the regions one at a time: under mu_ it picks the region's live, wanted
// records (and reads their headers right there while the region is still in
// a buffer); for a region on disk it reads the blocks holding those headers
// outside mu_, nearby headers sharing one read of at most kListReadBytes,
// checks each as the recovery scan does (RecordValidAt: intact, at its
// offset, of this region's sequence and file incarnation), and keeps, under
// mu_ again, those the index still points at in the same region incarnation.
// Only in-memory region lists are walked, so the index stays at its 28
// bytes per entry.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "store/ssd/ssd_engine.h"

namespace kvpool::ssd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kListReadBytes = 1ull << 20;
// Headers this close share a read: reading the gap costs less than another
// request (a 64 KiB value's record is just over it apart).
constexpr uint64_t kListMergeGap = 64ull << 10;

}  // namespace

struct SsdEngine::ListTarget {
  uint64_t offset = 0;  // of the record header inside its region
  uint64_t key_hi = 0;
  uint32_t length = 0;
  uint64_t key_lo = 0;  // from the header, once it checked out

  // True when h is this target's record, found where the index says.
  bool Matches(const RecordHeader& h, uint64_t region_bytes, const RecordExpect& at) const {
    return RecordValidAt(h, offset, region_bytes, at) && h.key_hi == key_hi &&
           h.value_len == length;
  }
};

std::vector<SsdEngine::ListTarget> SsdEngine::ListTargets(uint32_t global, const SsdKeyFilter& want,
                                                          uint64_t* seq, Device** dev,
                                                          uint32_t* incarnation) {
  std::vector<ListTarget> t;
  uint32_t di = 0;
  const Region& r = RegionOf(global, &di);
  if (r.state == RegionState::kFree) return t;
  for (uint64_t h : r.keys) {
    IndexLoc loc;
    if (want(h) && index_.Find(h, &loc) && loc.region == global) {
      t.push_back({loc.offset, h, loc.length});
    }
  }
  // A key inserted twice into one region is listed twice; two keys sharing
  // an index tag both name the record the index points at, and its header
  // tells which of them it is.
  auto key = [](const ListTarget& x) { return std::make_pair(x.offset, x.key_hi); };
  std::sort(t.begin(), t.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  t.erase(std::unique(t.begin(), t.end(),
                      [&](const auto& a, const auto& b) { return key(a) == key(b); }),
          t.end());
  *seq = r.seq;
  *dev = dirs_[di]->dev.get();
  *incarnation = dirs_[di]->incarnation();
  return t;
}

uint64_t SsdEngine::ListEntries(const SsdKeyFilter& want, const SsdEntrySink& sink) {
  const auto t0 = Clock::now();
  uint64_t listed = 0, read_bytes = 0;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(nullptr, &std::free);
  std::vector<SsdEntry> out;
  std::vector<ListTarget> found;
  // dirs_ and the region count are fixed once Start has run.
  const uint32_t regions = regions_per_dir_ * static_cast<uint32_t>(dirs_.size());
  for (uint32_t g = 0; g < regions; ++g) {
    out.clear();
    found.clear();
    std::vector<ListTarget> targets;
    uint64_t seq = 0;
    Device* dev = nullptr;
    uint32_t inc = 0;
    const uint64_t base = RegionOffset(g % regions_per_dir_);
    {
      std::lock_guard lock(mu_);
      if (closing_) break;
      targets = ListTargets(g, want, &seq, &dev, &inc);
      if (targets.empty()) continue;
      uint32_t di = 0;
      const Region& r = RegionOf(g, &di);
      if (r.buf != nullptr) {
        // Still in its buffer (filling or being written): the index entries
        // were published after their records were filled in.
        for (const ListTarget& t : targets) {
          RecordHeader h;
          std::memcpy(&h, r.buf + t.offset, sizeof(h));
          if (t.Matches(h, opts_.region_bytes, {base + t.offset, seq, inc})) {
            out.push_back({KeyId{t.key_hi, h.key_lo}, t.length});
          }
        }
        targets.clear();
      } else if (dev == nullptr) {
        targets.clear();
      } else {
        ++running_;  // Close and Abandon wait for the reads below
      }
    }
    if (!targets.empty()) {
      if (buf == nullptr) {
        buf.reset(AllocIoBuffer(kListReadBytes));
        KVPOOL_CHECK(buf != nullptr);
      }
      for (size_t i = 0; i < targets.size();) {
        const uint64_t start = AlignDown(base + targets[i].offset, kDeviceBlock);
        uint64_t end = AlignUp(base + targets[i].offset + kRecordHeaderBytes, kDeviceBlock);
        size_t j = i + 1;
        for (; j < targets.size(); ++j) {
          const uint64_t at = base + targets[j].offset;
          const uint64_t e = AlignUp(at + kRecordHeaderBytes, kDeviceBlock);
          if (AlignDown(at, kDeviceBlock) > end + kListMergeGap || e - start > kListReadBytes)
            break;
          end = std::max(end, e);
        }
        // A failed read lists none of its records (they stay held; a later
        // listing or a read finds out more).
        if (dev->Read(start, buf.get(), end - start).ok()) {
          read_bytes += end - start;
          for (size_t k = i; k < j; ++k) {
            ListTarget& t = targets[k];
            RecordHeader h;
            std::memcpy(&h, buf.get() + (base + t.offset - start), sizeof(h));
            if (t.Matches(h, opts_.region_bytes, {base + t.offset, seq, inc})) {
              t.key_lo = h.key_lo;
              found.push_back(t);
            }
          }
        }
        i = j;
      }
      std::lock_guard lock(mu_);
      --running_;
      cv_.notify_all();
      uint32_t di = 0;
      const bool same_region = RegionOf(g, &di).seq == seq;
      for (const ListTarget& t : found) {
        IndexLoc loc;
        if (same_region && index_.Find(t.key_hi, &loc) && loc.region == g &&
            loc.offset == t.offset) {
          out.push_back({KeyId{t.key_hi, t.key_lo}, t.length});
        }
      }
    }
    if (out.empty()) continue;
    listed += out.size();
    if (!sink(out)) break;
  }
  m_.list_entries->Inc(listed);
  m_.list_read_bytes->Inc(read_bytes);
  m_.list_seconds->Observe(std::chrono::duration<double>(Clock::now() - t0).count());
  return listed;
}

}  // namespace kvpool::ssd
