// NodeViews: what a node shows of itself -- the admin endpoint's status,
// members, clients and cluster views, the key figures every member's row of
// the cluster view holds (kPeerStatus), and readiness -- read from its
// parts. The cluster and the local server are told as they open (null:
// standalone, or not serving yet).
//
// Thread-safe once built: the views are called from the admin server's and
// the peer transport's threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster/cluster.h"
#include "common/metrics.h"
#include "node/local_server.h"
#include "node/node_options.h"
#include "node/node_stores.h"

namespace kvpool {

class NodeViews {
 public:
  // All pointers must outlive the views.
  NodeViews(const NodeOptions* options, uint64_t instance_id, const MetricsRegistry* metrics,
            const NodeStores* stores, const std::atomic<bool>* stopping);

  void set_cluster(Cluster* cluster) { cluster_.store(cluster); }
  void set_local(LocalServer* local) { local_.store(local); }

  double UptimeSeconds() const;
  // What keeps this node from cluster work; empty when nothing does (or
  // standalone).
  std::string ClusterMissing() const;
  // Local work is served from the start; cluster work once membership
  // admits this incarnation.
  nlohmann::ordered_json ReadinessJson() const;
  std::string StatusJson() const;
  // What a request without the admin token sees on a node with tenants
  // (AdminHooks::untokened): the node's figures summed over every tenant's
  // store, and no tenant's or client's own.
  std::string AggregateStatusJson() const;
  nlohmann::ordered_json StatusObject() const;
  // This node's key figures, as every member's row of the cluster view
  // shows them (kept under kPeerStatus's size limit).
  nlohmann::ordered_json KeyFiguresJson() const;
  // Every member's key figures side by side: this node's own, the others'
  // asked for over the peer transport (kPeerStatus, all at once, 1 s at
  // most); a member that does not answer is listed with the error.
  nlohmann::ordered_json ClusterJson() const;
  // The engines connected to the local socket: who (pid, user, the name its
  // hello gave, tenant), since when, and what they moved.
  nlohmann::ordered_json ClientsJson() const;
  // The membership view and the shard ownership it implies. Standalone: this
  // node alone, owning every shard.
  nlohmann::ordered_json MembersJson() const;
  // Per tenant, the default one first: quotas, use and traffic.
  nlohmann::ordered_json TenantsJson() const;
  nlohmann::ordered_json SsdJson() const;

  static constexpr const char* kDetailsNeedToken =
      "this node serves tenants: each tenant's figures and the connected clients are shown "
      "only with the admin token (--admin-token-file)";

 private:
  const TieredStore* store() const { return stores_->store(); }
  Cluster* cluster() const { return cluster_.load(); }
  LocalServer* local() const { return local_.load(); }

  const NodeOptions& o_;
  const uint64_t instance_id_;
  const std::chrono::steady_clock::time_point started_;
  const MetricsRegistry* const metrics_;
  const NodeStores* const stores_;
  const std::atomic<bool>* const stopping_;
  std::atomic<Cluster*> cluster_{nullptr};
  std::atomic<LocalServer*> local_{nullptr};
};

}  // namespace kvpool
