#include "store/ssd/ssd_store.h"

#include "store/ssd/ssd_engine.h"

namespace kvpool {

Status SsdOptions::Validate() const {
  if (dirs.empty()) return InvalidArgument("ssd: no directories");
  if (region_bytes < (64u << 10) || region_bytes % kDeviceBlock != 0 ||
      region_bytes > ssd::SsdIndex::kMaxRegionBytes) {
    return InvalidArgument("ssd: region_bytes must be a multiple of 4 KiB in [64 KiB, 1 GiB]");
  }
  const uint64_t per_dir = capacity_bytes / dirs.size();
  if (per_dir < ssd::kSuperblockBytes + 2 * region_bytes) {
    return InvalidArgument("ssd: capacity_bytes must give each directory at least 2 regions");
  }
  if ((per_dir - ssd::kSuperblockBytes) / region_bytes * dirs.size() >=
      ssd::SsdIndex::kMaxRegions) {
    return InvalidArgument("ssd: too many regions; raise region_bytes");
  }
  if (buffers_per_dir < 1) return InvalidArgument("ssd: buffers_per_dir must be >= 1");
  if (max_value_bytes == 0) return InvalidArgument("ssd: max_value_bytes must be > 0");
  return Status::Ok();
}

namespace {

class SsdStoreImpl final : public SsdStore {
 public:
  explicit SsdStoreImpl(std::shared_ptr<ssd::SsdEngine> e) : e_(std::move(e)) {}
  // Dropped without Close: stop background work, write nothing more (what
  // a crash leaves behind; the next start scans).
  ~SsdStoreImpl() override { e_->Abandon(); }

  bool Insert(const KeyId& key, const uint8_t* data, uint64_t size) override {
    return e_->Insert(key, data, size, /*wait=*/true);
  }
  bool TryInsert(const KeyId& key, const uint8_t* data, uint64_t size) override {
    return e_->Insert(key, data, size, /*wait=*/false);
  }
  LendResult InsertLent(const KeyId& key, const uint8_t* data, uint64_t size,
                        const LendTerms& terms,
                        const std::function<std::shared_ptr<void>()>& take) override {
    return e_->InsertLent(key, data, size, terms, take);
  }
  bool WaitForRoom(uint64_t size) override { return e_->WaitForRoom(size); }
  Result<uint64_t> Lookup(const KeyId& key) const override { return e_->Lookup(key); }
  bool Contains(const KeyId& key) const override { return e_->Lookup(key).ok(); }
  Status Read(const KeyId& key, uint8_t* dst, uint64_t size) override {
    return e_->Read(key, dst, size);
  }
  void Remove(const KeyId& key) override { e_->Remove(key); }
  Status Flush() override { return e_->Flush(); }
  Status Close() override { return e_->Close(); }
  uint64_t ListEntries(const SsdKeyFilter& want, const SsdEntrySink& sink) override {
    return e_->ListEntries(want, sink);
  }
  void SetDropListener(SsdDropListener listener) override {
    e_->SetDropListener(std::move(listener));
  }
  SsdStats GetStats() const override { return e_->GetStats(); }

 private:
  std::shared_ptr<ssd::SsdEngine> e_;
};

}  // namespace

Result<std::unique_ptr<SsdStore>> SsdStore::Open(const SsdOptions& options,
                                                 MetricsRegistry* metrics, Executor* executor) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto engine = std::make_shared<ssd::SsdEngine>(options, metrics, executor);
  KVPOOL_RETURN_IF_ERROR(engine->Start());
  return std::unique_ptr<SsdStore>(new SsdStoreImpl(std::move(engine)));
}

namespace ssd {

void SsdEngine::RegisterMetrics() {
  auto* r = metrics_;
  m_.reads = r->GetCounter("kvpool_ssd_reads_total", "Records read from SSD and verified.");
  m_.read_bytes = r->GetCounter("kvpool_ssd_read_bytes_total", "Value bytes read from SSD.");
  m_.writes = r->GetCounter("kvpool_ssd_writes_total", "Region writes completed.");
  m_.write_bytes = r->GetCounter("kvpool_ssd_write_bytes_total", "Bytes written to SSD.");
  m_.crc_failures = r->GetCounter("kvpool_ssd_crc_failures_total",
                                  "Records that failed verification (CRC, misplaced, torn).");
  m_.region_evictions =
      r->GetCounter("kvpool_ssd_region_evictions_total", "Regions reclaimed (FIFO).");
  m_.inserts_dropped = r->GetCounter(
      "kvpool_ssd_inserts_dropped_total",
      "Inserts refused or lost: no free buffer, offline, too large, failed region write.");
  m_.read_errors = r->GetCounter("kvpool_ssd_read_errors_total", "Device read errors (misses).");
  m_.write_errors =
      r->GetCounter("kvpool_ssd_write_errors_total", "Region writes that failed after retries.");
  m_.list_entries = r->GetCounter("kvpool_ssd_list_entries_total",
                                  "Entries listed with their key ids (cluster inventory replay).");
  m_.list_read_bytes = r->GetCounter("kvpool_ssd_list_read_bytes_total",
                                     "Bytes read from SSD to list entries (record headers).");
  m_.dropped_reported = r->GetCounter(
      "kvpool_ssd_drops_reported_total",
      "Entries the tier dropped by itself (region reclaimed or lost) told to its listener.");
  m_.dropped_unreported = r->GetCounter(
      "kvpool_ssd_drops_unreported_total",
      "Entries of reclaimed regions not told to the drop listener: too many small records to "
      "read their headers before the region is rewritten.");
  m_.lent_copied = r->GetCounter(
      "kvpool_ssd_lent_records_total",
      "Values demoted without a copy under the DRAM lock, by how their bytes reached the region "
      "write: copied into the region buffer by its flush, or written from DRAM (gather).",
      {{"mode", "copy"}});
  m_.lent_gathered = r->GetCounter("kvpool_ssd_lent_records_total", "", {{"mode", "gather"}});
  m_.list_seconds = r->GetHistogram("kvpool_ssd_list_seconds",
                                    "Time of one entry listing (ListEntries), all regions.");
  m_.read_latency = r->GetHistogram("kvpool_ssd_read_latency_seconds", "Device read latency.");
  m_.write_latency =
      r->GetHistogram("kvpool_ssd_write_latency_seconds", "Device write latency (per region).");
  auto stat = [this](auto fn) {
    return [this, fn] {
      SsdStats s = GetStats();
      return static_cast<double>(fn(s));
    };
  };
  r->AddCallbackGauge("kvpool_ssd_capacity_bytes", "SSD tier capacity.", {},
                      stat([](const SsdStats& s) { return s.capacity_bytes; }), this);
  r->AddCallbackGauge("kvpool_ssd_used_bytes", "Bytes of regions holding records.", {},
                      stat([](const SsdStats& s) { return s.used_bytes; }), this);
  r->AddCallbackGauge("kvpool_ssd_entries", "Indexed records.", {},
                      stat([](const SsdStats& s) { return s.entries; }), this);
  r->AddCallbackGauge("kvpool_ssd_index_bytes", "Memory of the SSD index.", {},
                      stat([](const SsdStats& s) { return s.index_bytes; }), this);
  r->AddCallbackGauge("kvpool_ssd_lent_bytes",
                      "Value bytes demoted without a copy whose DRAM slots the SSD tier still "
                      "holds (until their region's flush copies or writes them).",
                      {}, stat([](const SsdStats& s) { return s.lent_bytes; }), this);
  r->AddCallbackGauge("kvpool_ssd_online", "1 while the SSD tier accepts writes.", {},
                      stat([](const SsdStats& s) { return s.online ? 1 : 0; }), this);
  for (size_t i = 0; i < dirs_.size(); ++i) {
    Dir& d = *dirs_[i];
    const Labels l = {{"dir", d.dir}};
    d.m.reads = r->GetCounter("kvpool_ssd_dir_reads_total", "Records read, per directory.", l);
    d.m.writes =
        r->GetCounter("kvpool_ssd_dir_writes_total", "Region writes, per directory.", l);
    auto dstat = [this, i](auto fn) {
      return [this, i, fn] {
        SsdStats s = GetStats();
        return static_cast<double>(fn(s.dirs[i]));
      };
    };
    r->AddCallbackGauge("kvpool_ssd_dir_used_bytes", "Bytes used, per directory.", l,
                        dstat([](const SsdDirStats& s) { return s.used_bytes; }), this);
    r->AddCallbackGauge("kvpool_ssd_dir_capacity_bytes", "Capacity, per directory.", l,
                        dstat([](const SsdDirStats& s) { return s.capacity_bytes; }), this);
    r->AddCallbackGauge("kvpool_ssd_dir_online", "1 while the directory accepts writes.", l,
                        dstat([](const SsdDirStats& s) { return s.online ? 1 : 0; }), this);
  }
}

}  // namespace ssd
}  // namespace kvpool
