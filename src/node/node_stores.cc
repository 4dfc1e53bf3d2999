#include "node/node_stores.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "common/log.h"

namespace kvpool {

NodeStores::~NodeStores() { Close(/*persist=*/false); }

Status NodeStores::Load(const NodeOptions& o,
                        const std::vector<transport::ClusterKey>& client_tokens) {
  if (o.tenants_file.empty()) return Status::Ok();
  KVPOOL_ASSIGN_OR_RETURN(auto specs, LoadTenantsFile(o.tenants_file));
  for (const auto& t : specs) {
    if (t.ssd_bytes > 0 && o.ssd_dirs.empty()) {
      return InvalidArgument(
          fmt::format("tenants file {}: tenant '{}' has an SSD quota but the node has no SSD tier "
                      "(--ssd-dirs)",
                      o.tenants_file, t.name));
    }
    TenantStore ts{t, nullptr, nullptr, {}};
    for (const auto& token : t.tokens) {
      auto k = std::find_if(client_tokens.begin(), client_tokens.end(),
                            [&](const transport::ClusterKey& c) { return c.principal == token; });
      if (k == client_tokens.end()) {
        LogWarn("tenant {}: token '{}' is not in --client-token-file; no client can use it", t.name,
                token);
        continue;
      }
      ts.token_secrets[token] = k->bytes;
    }
    tenants_.push_back(std::move(ts));
  }
  return Status::Ok();
}

// Each tenant's own store: a segment of its DRAM quota and, with an SSD
// quota, a directory "tenant-NAME" under each SSD directory. Its figures
// are kept in its own registry and exported per tenant.
Status NodeStores::Open(const NodeOptions& o, MetricsRegistry* metrics) {
  metrics_ = metrics;
  io_pool_ = std::make_unique<ThreadPool>(o.io_threads, "kvpool-io");
  // Region flushes get their own threads: a promotion waiting for DRAM
  // room may wait for a demotion, which waits for a flush.
  flush_pool_ = std::make_unique<ThreadPool>(o.flush_threads, "kvpool-flush");
  std::optional<SsdOptions> so;
  if (!o.ssd_dirs.empty()) so = o.SsdWithDirs();
  KVPOOL_ASSIGN_OR_RETURN(store_,
                          TieredStore::Open(o.DramFor(o.dram.capacity_bytes), so ? &*so : nullptr,
                                            io_pool_.get(), flush_pool_.get(), o.tiering, metrics));
  for (auto& t : tenants_) {
    std::optional<SsdOptions> tso;
    if (t.spec.ssd_bytes > 0) {
      tso = o.SsdWithDirs();
      tso->capacity_bytes = t.spec.ssd_bytes;
      for (auto& dir : tso->dirs) {
        dir += "/tenant-" + t.spec.name;
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
          return Internal(
              fmt::format("tenant {}: mkdir {}: {}", t.spec.name, dir, std::strerror(errno)));
        }
      }
    }
    t.metrics = std::make_unique<MetricsRegistry>();
    DramOptions tdo = o.DramFor(t.spec.dram_bytes);
    if (t.spec.pin_bytes) tdo.pin_max_bytes = *t.spec.pin_bytes;
    auto store = TieredStore::Open(tdo, tso ? &*tso : nullptr, io_pool_.get(), flush_pool_.get(),
                                   o.tiering, t.metrics.get());
    if (!store.ok()) {
      return Status(store.status().code(),
                    fmt::format("tenant {}: {}", t.spec.name, store.status().message()));
    }
    t.store = std::move(store).value();
    LogInfo("tenant {}: dram {}{}", t.spec.name, SettingsTable::FormatBytes(t.spec.dram_bytes),
            tso ? " ssd " + SettingsTable::FormatBytes(t.spec.ssd_bytes) : std::string());
  }
  AddTenantGauges(kDefaultTenant, store_.get());
  for (auto& t : tenants_) AddTenantGauges(t.spec.name, t.store.get());
  return Status::Ok();
}

void NodeStores::AddTenantGauges(const std::string& name, TieredStore* store) {
  Labels l = {{"tenant", name}};
  auto dram = [store](uint64_t DramStats::*f) {
    return [store, f] { return static_cast<double>(store->GetDramStats().*f); };
  };
  metrics_->AddCallbackGauge("kvpool_tenant_dram_capacity_bytes",
                             "DRAM quota (segment), per tenant", l,
                             dram(&DramStats::capacity_bytes), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_used_bytes", "DRAM bytes of values, per tenant", l,
                             dram(&DramStats::used_bytes), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_entries", "DRAM entries, per tenant", l,
                             dram(&DramStats::entries), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_evictions",
                             "DRAM entries evicted since start, per tenant", l,
                             dram(&DramStats::evictions), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_retained_bytes",
                             "DRAM bytes of values cache hints retain now, per tenant", l,
                             dram(&DramStats::retained_bytes), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_hint_pinned_bytes",
                             "DRAM bytes of values cache hints pin now, per tenant", l,
                             dram(&DramStats::hint_pinned_bytes), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_leases_expired",
                             "Cache hints' leases that ran out, per tenant", l,
                             dram(&DramStats::leases_expired), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_retains_clipped",
                             "Retentions ended by --retain-max-percent, per tenant", l,
                             dram(&DramStats::retains_clipped), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_demoted_entries",
                             "DRAM entries cache hints demoted, first in line to go, per tenant", l,
                             dram(&DramStats::demoted_entries), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_prefetched_entries",
                             "DRAM entries a prefetch brought in, not read yet, per tenant", l,
                             dram(&DramStats::prefetched_entries), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_prefetch_hits",
                             "Prefetched entries read (each at its first read), per tenant", l,
                             dram(&DramStats::prefetch_hits), this);
  metrics_->AddCallbackGauge("kvpool_tenant_dram_prefetch_unused",
                             "Prefetched entries that left DRAM unread, per tenant", l,
                             dram(&DramStats::prefetch_unused), this);
  metrics_->AddCallbackGauge(
      "kvpool_tenant_dram_prefetch_mean_lead_seconds",
      "Mean time from a prefetch to the entry's first read, over the prefetch hits since start, "
      "per tenant",
      l, [store] { return store->GetDramStats().prefetch_mean_lead_seconds(); }, this);
  if (store->GetDramStats().eviction.adaptive) {
    // Each tenant's store adapts its policy to its own traffic.
    auto adaptation = [store](auto field) {
      return [store, field] { return static_cast<double>(store->GetDramStats().eviction.*field); };
    };
    metrics_->AddCallbackGauge("kvpool_tenant_dram_eviction_protected_share",
                               "The prefix policy's protected share, as the tenant's own shadow "
                               "caches chose it, per tenant",
                               l, adaptation(&EvictionAdaptation::protected_share), this);
    metrics_->AddCallbackGauge("kvpool_tenant_dram_eviction_bimodal",
                               "1 when the share the tenant's shadow caches chose inserts "
                               "bimodally, else 0, per tenant",
                               l, adaptation(&EvictionAdaptation::bimodal), this);
    metrics_->AddCallbackGauge("kvpool_tenant_dram_eviction_share_changes",
                               "Times the tenant's protected share changed, per tenant", l,
                               adaptation(&EvictionAdaptation::share_changes), this);
  }
  if (!store->has_ssd_tier()) return;
  auto ssd = [store](uint64_t SsdStats::*f) {
    return [store, f] { return static_cast<double>(store->GetSsdStats().*f); };
  };
  metrics_->AddCallbackGauge("kvpool_tenant_ssd_capacity_bytes", "SSD quota, per tenant", l,
                             ssd(&SsdStats::capacity_bytes), this);
  metrics_->AddCallbackGauge("kvpool_tenant_ssd_used_bytes", "SSD bytes used, per tenant", l,
                             ssd(&SsdStats::used_bytes), this);
  metrics_->AddCallbackGauge("kvpool_tenant_ssd_entries", "SSD entries, per tenant", l,
                             ssd(&SsdStats::entries), this);
}

void NodeStores::StopPromotions() {
  if (io_pool_) io_pool_->Stop();
}

void NodeStores::Close(bool persist) {
  if (metrics_ != nullptr) metrics_->RemoveCallbacks(this);
  metrics_ = nullptr;
  StopPromotions();
  auto close = [persist](TieredStore* store, const std::string& tenant) {
    if (store == nullptr || !store->has_ssd_tier()) return;
    if (persist) {
      // A clean stop keeps the whole cache: DRAM goes to SSD first.
      uint64_t n = store->DemoteAll();
      LogInfo("tenant {}: wrote {} DRAM entries to the SSD tier before stopping", tenant, n);
    }
    Status s = store->Close();  // flush and checkpoint: a warm restart
    if (!s.ok()) LogWarn("tenant {}: ssd tier close: {}", tenant, s.ToString());
  };
  close(store_.get(), kDefaultTenant);
  for (auto& t : tenants_) close(t.store.get(), t.spec.name);
  tenants_.clear();
  store_.reset();
  if (flush_pool_) flush_pool_->Stop();
  io_pool_.reset();
  flush_pool_.reset();
}

}  // namespace kvpool
