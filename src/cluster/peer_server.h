// PeerServer: answers peers' directory and data requests on this node.
//
// Publish batches go into the local Directory; Lookup answers from it;
// Fetch answers with a value pinned in DRAM, sent zero-copy (the pin is
// released by the transport's release callback once the bytes are out),
// promoting it from SSD first when it is only there; Store (placement home)
// keeps a value handed over by its writer. A fenced node answers
// Unavailable. On every membership view it prunes the directory of dead
// incarnations and replays this node's inventory of the shards whose home
// moved to their new homes (HoldingsAnnouncer::Relist) -- all of it when this
// node itself came back under a new incarnation. The inventory is the DRAM
// entries, listed under the DRAM lock, and with an SSD tier the SSD's
// entries that the DRAM replay did not just publish, listed from their
// record headers on the list executor (device reads; seconds for a large
// tier); at start the whole SSD tier is listed that way, so what a
// restarted node recovered is published. (What the store gains and drops
// from then on reaches the homes through the holdings stream.)
//
// Every tenant across the cluster (ClusterTenant) has its own store,
// directory and announcer here: the tenant-scoped types of Publish, Lookup,
// Fetch and Store reach them, and views and fences act on each tenant as on
// the default one.
//
// A view also drops the entries of shards this node no longer owns, and a
// fence drops every entry (the node missed updates; holders replay to its new
// incarnation). Anti-entropy (anti_entropy.h) repairs what replays miss.
//
// Thread-safe. Handlers run on the transport's handler executor; view work
// runs on the executor, SSD listings on the list executor. Destroy only
// after the cluster itself (its transport runs the handlers, its membership
// the view callback) and after the executor has drained; destruction stops a
// running SSD listing after its current
// region and waits for it, and work still queued on the list executor then
// does nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/holdings_announcer.h"
#include "common/executor.h"
#include "common/gate.h"
#include "common/metrics.h"
#include "common/tenant_keys.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

// A tenant as remote-mode clients holding one of its tokens reach it
// (node/tenants.h): their key ids are bound to the tenant and their
// lookups, fetches and stores go to the tenant's own store on the key's
// home, apart from the cluster's directory.
struct ClientTenant {
  TieredStore* store = nullptr;  // must outlive the server
  TenantKeys keys{""};
};
// By client token name (Incoming::principal). A client whose token is not
// listed uses the default tenant: the cluster.
using ClientTenants = std::unordered_map<std::string, ClientTenant>;

// A tenant across the cluster (node/tenants.h: the same name on every
// node): its store, its directory and its announcer on this node. Members'
// tenant-scoped messages (peer_messages_format.h) about it reach these, as
// the unscoped ones reach the default tenant's; a tenant not listed here is
// refused (FailedPrecondition). Its keys arrive bound to it already.
struct ClusterTenant {
  TieredStore* store = nullptr;           // must outlive the server
  Directory* directory = nullptr;         // must outlive the server
  HoldingsAnnouncer* announcer = nullptr;  // must outlive the server
};
// By tenant name.
using ClusterTenants = std::unordered_map<std::string, ClusterTenant>;

class PeerServer {
 public:
  // Registers the handlers and subscribes to views. All pointers must
  // outlive the server. list_executor runs the SSD listings (one thread is
  // enough: they run one after another); null: the executor. metrics null:
  // the counters are kept but not exported.
  PeerServer(Cluster* cluster, Directory* directory, HoldingsAnnouncer* announcer, TieredStore* store,
             Executor* executor, Executor* list_executor = nullptr,
             MetricsRegistry* metrics = nullptr, ClientTenants client_tenants = {},
             ClusterTenants cluster_tenants = {});
  ~PeerServer();
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

 private:
  // What one request is about: the default tenant's or a cluster tenant's
  // store, directory and announcer.
  struct Scope {
    TieredStore* store = nullptr;
    Directory* directory = nullptr;
    HoldingsAnnouncer* announcer = nullptr;
    bool tenant = false;  // a cluster tenant's (its keys come bound)
  };
  using ScopedHandler =
      std::function<Status(const Scope&, transport::Incoming&, transport::Responder&)>;
  // Registers `base` (metrics label `name`) for the default tenant and its
  // tenant-scoped type ("tenant_" + name) for the cluster's tenants, the
  // scope taken off the request header; both through ServePeer
  // (peer_handler.h), which refuses while this node is fenced.
  void HandleScoped(transport::MessageType base, std::string_view name, ScopedHandler fn);
  // The default tenant's scope, then every cluster tenant's.
  std::vector<Scope> Scopes() const;

  // The tenant of a client's request; null for members and default-tenant
  // clients.
  const ClientTenant* TenantOf(const transport::Incoming& in) const;
  // The store a request's key is in: its client's tenant's (binding *key to
  // the tenant), else this node's.
  TieredStore* StoreFor(const transport::Incoming& in, KeyId* key) const;
  // Answers a lookup from `store` itself, not a directory: each key it
  // holds (bound by `bind` when given) lists this node alone as holder.
  void OwnLookup(TieredStore* store, const TenantKeys* bind, std::vector<KeyId> keys,
                 transport::Responder r);

  void OnView(std::shared_ptr<const ShardMap> before, std::shared_ptr<const ShardMap> after,
              std::shared_ptr<const MembershipView> view, bool replay_all);

  // Runs fn on the list executor unless the server is gone by then; the
  // destructor waits for a running fn.
  void RunGated(std::function<void()> fn);
  // Queues the re-announcement of what the scope's store holds of the
  // shards marked in `shards` (kNumShards flags:
  // HoldingsAnnouncer::Republish), on the list executor.
  void Relist(const Scope& scope, std::vector<bool> shards);

  Cluster* const cluster_;
  Directory* const directory_;
  const ClientTenants client_tenants_;
  const ClusterTenants cluster_tenants_;
  HoldingsAnnouncer* const announcer_;
  TieredStore* const store_;
  Executor* const executor_;
  Executor* const list_executor_;
  std::unique_ptr<MetricsRegistry> owned_metrics_;  // when none was given
  MetricsRegistry* const metrics_;
  Counter* ssd_replayed_;
  Counter* tenant_refused_;
  // Shared with queued listings, which may run after the server is gone.
  std::shared_ptr<Gate> gate_ = Gate::Shared();
  uint64_t sub_ = 0;
  uint64_t fence_sub_ = 0;
  // Only touched by the membership's callback thread.
  std::shared_ptr<const ShardMap> last_map_;
  uint64_t last_incarnation_ = 0;
};

}  // namespace kvpool::cluster
