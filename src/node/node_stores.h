// NodeStores: a node's stores, the default tenant's and one per tenant of
// the tenants file (node/tenants.h), with the pools their promotions and
// SSD region writes run on, and the per-tenant store gauges.
//
// Load reads the tenants file before anything is allocated; Open opens the
// stores; StopPromotions stops the promotions (their completions reach the
// local server, which goes after them); Close writes DRAM to SSD when asked
// (a warm restart), checkpoints and closes each SSD tier.
// Not thread-safe: opened and closed by the node's start and stop; the
// stores themselves are thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/executor.h"
#include "common/metrics.h"
#include "node/node_options.h"
#include "node/tenants.h"
#include "store/tiered_store.h"
#include "transport/peer_auth.h"

namespace kvpool {

// One tenant of the tenants file: its store, and the registry of its store's
// figures (exported per tenant).
struct TenantStore {
  TenantSpec spec;
  std::unique_ptr<MetricsRegistry> metrics;
  std::unique_ptr<TieredStore> store;
  // The secrets of spec.tokens that --client-token-file holds, by name.
  std::map<std::string, std::array<uint8_t, 32>> token_secrets;
};

class NodeStores {
 public:
  NodeStores() = default;
  ~NodeStores();
  NodeStores(const NodeStores&) = delete;
  NodeStores& operator=(const NodeStores&) = delete;

  // Reads --tenants-file (none: one tenant, the default), each tenant's
  // token secrets from client_tokens.
  Status Load(const NodeOptions& options, const std::vector<transport::ClusterKey>& client_tokens);
  // The pools, the default tenant's store and each tenant's, and the
  // kvpool_tenant_* gauges in metrics (which must outlive this object).
  Status Open(const NodeOptions& options, MetricsRegistry* metrics);
  // Stops the promotions in flight (idempotent).
  void StopPromotions();
  // Stops and closes every store; persist: DRAM goes to SSD first.
  void Close(bool persist);

  TieredStore* store() const { return store_.get(); }
  const std::vector<TenantStore>& tenants() const { return tenants_; }

 private:
  void AddTenantGauges(const std::string& name, TieredStore* store);

  MetricsRegistry* metrics_ = nullptr;
  std::unique_ptr<ThreadPool> io_pool_;     // promotions (SSD reads into DRAM)
  std::unique_ptr<ThreadPool> flush_pool_;  // SSD region writes
  std::unique_ptr<TieredStore> store_;      // DRAM, and SSD with --ssd: the default tenant
  std::vector<TenantStore> tenants_;
};

}  // namespace kvpool
