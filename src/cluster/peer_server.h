// PeerServer: answers peers' directory and data requests on this node.
//
// Publish batches go into the local Directory; Lookup answers from it;
// Fetch answers with a value pinned in DRAM, sent zero-copy (the pin is
// released by the transport's release callback once the bytes are out),
// promoting it from SSD first when it is only there; Store (placement home)
// keeps a value handed over by its writer. A fenced node answers
// Unavailable. On every membership view it prunes the directory of dead
// incarnations and replays this node's DRAM inventory of the shards whose
// home moved to their new homes (through the Publisher) -- all of it when
// this node itself came back under a new incarnation.
//
// Thread-safe. Handlers run on the transport's handler executor; view work
// runs on the executor. Destroy only after the cluster itself (its
// transport runs the handlers, its membership the view callback) and after
// the executor has drained.
#pragma once

#include <memory>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/publisher.h"
#include "common/executor.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

class PeerServer {
 public:
  // Registers the handlers and subscribes to views. All pointers must
  // outlive the server.
  PeerServer(Cluster* cluster, Directory* directory, Publisher* publisher, TieredStore* store,
             Executor* executor);
  ~PeerServer();
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

 private:
  void OnView(std::shared_ptr<const ShardMap> before, std::shared_ptr<const ShardMap> after,
              std::shared_ptr<const MembershipView> view, bool replay_all);

  Cluster* const cluster_;
  Directory* const directory_;
  Publisher* const publisher_;
  TieredStore* const store_;
  Executor* const executor_;
  uint64_t sub_ = 0;
  // Only touched by the membership's callback thread.
  std::shared_ptr<const ShardMap> last_map_;
  uint64_t last_incarnation_ = 0;
};

}  // namespace kvpool::cluster
