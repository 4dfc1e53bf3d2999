// The SSD tier's entries with their full key ids, for a cluster node to
// tell the keys' homes what it holds: listing them (SsdStore::ListEntries)
// and reporting the ones the tier drops by itself (SetDropListener).
//
// Memory knows which records are live and wanted: each region lists the
// KeyId::hi of its records, and the index says whether it points at that
// record. The full key id is only in the record header, so a listing walks
// the regions one at a time: under mu_ it picks the region's live, wanted
// records (and reads their headers right there while the region is still in
// a buffer); for a region on disk it reads the blocks holding those headers
// outside mu_, nearby headers sharing one read of at most kHeaderReadBytes,
// checks each as the recovery scan does (RecordValidAt: intact, at its
// offset, of this region's sequence and file incarnation), and keeps, under
// mu_ again, those the index still points at in the same region incarnation.
// Only in-memory region lists are walked, so the index stays at its 28
// bytes per entry.
//
// Dropped entries: reclaiming a region (under mu_, on the insert path)
// notes its live records with the region (Region::reclaimed); their
// headers are still on disk until the region's next write, so FlushOne
// reads them (ReadHeaders) just before that write and reports them.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "store/ssd/ssd_engine.h"

namespace kvpool::ssd {
namespace {

using SteadyClock = std::chrono::steady_clock;

}  // namespace

std::vector<RecordRef> SsdEngine::ListTargets(uint32_t global, const SsdKeyFilter& want) {
  std::vector<RecordRef> t;
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
  auto key = [](const RecordRef& x) { return std::make_pair(x.offset, x.key_hi); };
  std::sort(t.begin(), t.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  t.erase(std::unique(t.begin(), t.end(),
                      [&](const auto& a, const auto& b) { return key(a) == key(b); }),
          t.end());
  return t;
}

uint64_t SsdEngine::ReadHeaders(const Dir& d, uint32_t ri, uint64_t seq,
                                const std::vector<RecordRef>& refs, uint8_t* buf,
                                std::vector<RecordRef>* found) {
  const uint64_t base = RegionOffset(ri);
  uint64_t read_bytes = 0;
  for (size_t i = 0; i < refs.size();) {
    const uint64_t start = AlignDown(base + refs[i].offset, kDeviceBlock);
    uint64_t end = AlignUp(base + refs[i].offset + kRecordHeaderBytes, kDeviceBlock);
    size_t j = i + 1;
    for (; j < refs.size(); ++j) {
      const uint64_t at = base + refs[j].offset;
      const uint64_t e = AlignUp(at + kRecordHeaderBytes, kDeviceBlock);
      if (AlignDown(at, kDeviceBlock) > end + kHeaderMergeGap || e - start > kHeaderReadBytes) {
        break;
      }
      end = std::max(end, e);
    }
    // A failed read finds none of its records.
    if (d.dev->Read(start, buf, end - start).ok()) {
      read_bytes += end - start;
      for (size_t k = i; k < j; ++k) {
        RecordRef t = refs[k];
        RecordHeader h;
        std::memcpy(&h, buf + (base + t.offset - start), sizeof(h));
        if (t.Matches(h, opts_.region_bytes, {base + t.offset, seq, d.incarnation()})) {
          t.key_lo = h.key_lo;
          found->push_back(t);
        }
      }
    }
    i = j;
  }
  return read_bytes;
}

uint64_t SsdEngine::ListEntries(const SsdKeyFilter& want, const SsdEntrySink& sink) {
  const auto t0 = SteadyClock::now();
  uint64_t listed = 0, read_bytes = 0;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(nullptr, &std::free);
  std::vector<SsdEntry> out;
  std::vector<RecordRef> found;
  // dirs_ and the region count are fixed once Start has run.
  const uint32_t regions = regions_per_dir_ * static_cast<uint32_t>(dirs_.size());
  for (uint32_t g = 0; g < regions; ++g) {
    out.clear();
    found.clear();
    std::vector<RecordRef> targets;
    uint32_t di = 0;
    const Region& r = RegionOf(g, &di);
    const Dir& d = *dirs_[di];
    const uint32_t ri = g % regions_per_dir_;
    uint64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      if (closing_) break;
      targets = ListTargets(g, want);
      seq = r.seq;
      if (targets.empty()) continue;
      if (r.buf != nullptr) {
        // Still in its buffer (filling or being written): the index entries
        // were published after their records were filled in.
        for (const RecordRef& t : targets) {
          RecordHeader h;
          std::memcpy(&h, r.buf + t.offset, sizeof(h));
          if (t.Matches(h, opts_.region_bytes,
                        {RegionOffset(ri) + t.offset, seq, d.incarnation()})) {
            out.push_back({KeyId{t.key_hi, h.key_lo}, t.length});
          }
        }
        targets.clear();
      } else if (d.dev == nullptr) {
        targets.clear();
      } else {
        ++running_;  // Close and Abandon wait for the reads below
      }
    }
    if (!targets.empty()) {
      if (buf == nullptr) {
        buf.reset(AllocIoBuffer(kHeaderReadBytes));
        KVPOOL_CHECK(buf != nullptr);
      }
      read_bytes += ReadHeaders(d, ri, seq, targets, buf.get(), &found);
      std::lock_guard lock(mu_);
      --running_;
      cv_.notify_all();
      // Still the index's records, in the region as it was read?
      const bool same_region = r.seq == seq;
      for (const RecordRef& t : found) {
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
  m_.list_seconds->Observe(std::chrono::duration<double>(SteadyClock::now() - t0).count());
  return listed;
}

void SsdEngine::SetDropListener(SsdDropListener listener) {
  const bool set = static_cast<bool>(listener);
  {
    std::lock_guard lock(listener_mu_);  // waits for a running call
    drop_listener_ = std::move(listener);
  }
  std::lock_guard lock(mu_);
  report_drops_ = set;
}

void SsdEngine::ReportDropped(const std::vector<RecordRef>& refs,
                              std::unique_lock<std::mutex>& lock) {
  std::vector<SsdEntry> gone;
  for (const RecordRef& t : refs) {
    IndexLoc loc;
    // Not if it was stored again since (a later demotion of the key).
    if (!index_.Find(t.key_hi, &loc)) gone.push_back({KeyId{t.key_hi, t.key_lo}, t.length});
  }
  if (gone.empty()) return;
  m_.dropped_reported->Inc(gone.size());
  lock.unlock();
  {
    std::lock_guard l(listener_mu_);
    if (drop_listener_) drop_listener_(gone);
  }
  lock.lock();
}

}  // namespace kvpool::ssd
