// ClusterServices: what a node runs in a cluster, opened and stopped as one.
// Membership and the peer transport (Cluster); the directory of the keys
// this node is home of; the holdings announcer (publishing, placement, and
// every re-announcement); the peer server; anti-entropy; the block index;
// and remote reads. Each tenant of the node (node/tenants.h) has a
// directory, an announcer and a reader of its own over its store.
//
// Each peer message has one handler home among these (docs/architecture.md
// lists them); kPeerStatus, the admin cluster view's question, is answered
// here with the node's key figures.
//
// Open runs the membership loop on a thread of its own; Stop (idempotent,
// also by the destructor) leaves the cluster and joins it. Peer calls in
// flight when it stops fail: their callbacks may still reach the remote
// source's users, which must outlive this object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "blocks/descriptor_table.h"
#include "cluster/anti_entropy.h"
#include "cluster/block_index.h"
#include "cluster/cluster.h"
#include "cluster/cluster_placement.h"
#include "cluster/directory.h"
#include "cluster/holdings_announcer.h"
#include "cluster/peer_server.h"
#include "cluster/remote_reader.h"
#include "common/enum_names.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct ClusterServicesOptions {
  ClusterOptions cluster;  // complete: node id, endpoints, keys, tokens, segment
  Placement placement = Placement::kLocal;
  // Placement home and chain: value bytes handed to homes at once (at most
  // a quarter of dram_capacity_bytes: the rest of DRAM stays evictable).
  uint64_t placement_max_inflight = 64ull << 20;
  uint64_t dram_capacity_bytes = 0;
  DirectoryOptions directory;
  RemoteReaderOptions remote;
  AntiEntropyOptions anti_entropy;
  BlockIndexOptions block_index;
};

// A tenant of this node: one tenant across the cluster (every node that
// defines it). Its store and registry must outlive the services.
struct ServicesTenant {
  std::string name;
  std::vector<std::string> tokens;  // the client tokens that map to it
  TieredStore* store = nullptr;
  MetricsRegistry* metrics = nullptr;
};

class ClusterServices {
 public:
  // Opens every service over `store` (the default tenant's) and each
  // tenant's store. descriptors: the blocks layer, whose tier changes the
  // block index follows (events: its other listener, kept; may be null).
  // key_figures: this node's row of the cluster view (kPeerStatus), called
  // on a peer thread. All pointers must outlive the services.
  static Result<std::unique_ptr<ClusterServices>> Open(const ClusterServicesOptions& options,
                                                       TieredStore* store,
                                                       blocks::DescriptorTable* descriptors,
                                                       blocks::BlockEventListener* events,
                                                       std::vector<ServicesTenant> tenants,
                                                       MetricsRegistry* metrics,
                                                       std::function<std::string()> key_figures);
  ~ClusterServices();
  ClusterServices(const ClusterServices&) = delete;
  ClusterServices& operator=(const ClusterServices&) = delete;

  // Leaves the cluster; idempotent.
  void Stop();

  Cluster* cluster() const { return cluster_.get(); }
  BlockIndex* block_index() const { return block_index_.get(); }
  // Remote reads and the placement of writes of the default tenant, and
  // of tenant i (Open's order).
  RemoteReader* reader() const { return reader_.get(); }
  RemotePlacement* placement() const { return placement_.get(); }
  RemoteReader* tenant_reader(size_t i) const { return tenants_[i].reader.get(); }
  RemotePlacement* tenant_placement(size_t i) const { return tenants_[i].placement.get(); }

 private:
  struct Tenant {
    ServicesTenant spec;
    std::unique_ptr<Directory> directory;
    std::unique_ptr<HoldingsAnnouncer> announcer;
    std::unique_ptr<RemoteReader> reader;
    std::unique_ptr<ClusterPlacement> placement;
  };
  ClusterServices() = default;
  Status OpenAll(const ClusterServicesOptions& options, TieredStore* store,
                 MetricsRegistry* metrics, std::function<std::string()> key_figures);
  // The reader options of every tenant's reads.
  static RemoteReaderOptions ReaderOptions(const ClusterServicesOptions& options);

  blocks::DescriptorTable* descriptors_ = nullptr;
  blocks::BlockEventListener* events_ = nullptr;
  std::unique_ptr<ThreadPool> peer_pool_;  // peer request handlers
  std::unique_ptr<ThreadPool> list_pool_;  // SSD inventory listings (with an SSD tier)
  std::unique_ptr<Cluster> cluster_;
  std::thread cluster_thread_;  // the membership loop
  std::unique_ptr<Directory> directory_;
  std::unique_ptr<HoldingsAnnouncer> announcer_;
  std::vector<Tenant> tenants_;
  std::unique_ptr<PeerServer> peer_server_;
  std::unique_ptr<BlockIndex> block_index_;
  std::unique_ptr<AntiEntropy> anti_entropy_;
  std::unique_ptr<RemoteReader> reader_;
  std::unique_ptr<ClusterPlacement> placement_;
  bool stopped_ = false;
};

}  // namespace kvpool::cluster
