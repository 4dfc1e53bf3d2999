// LocalServer: serves engines on this host over a Unix socket.
//
// The handshake passes the DRAM segment's fd (SCM_RIGHTS) so a client maps
// it and moves bytes with memcpy or DMA; the socket carries only small
// control messages (reserve/commit, acquire/release, exists), plus inline
// bytes for copy-mode clients that do not map the segment. Reservations and
// pins belong to the connection: when a client goes away they are released.
//
// No client can hold the node's resources for long: connections are capped
// (a refused one is told "too many connections"), and closed when they miss
// the handshake, frame or idle deadline; request bytes are buffered as they
// arrive, one frame per connection, within a node-wide budget.
//
// Threading: Run() is the event loop (one epoll thread, given by the node);
// Stop() may be called from any thread. Everything else is owned by the loop.
// Promotions complete on the store's executor (remote reads on the
// cluster's threads) and hand back to the loop; both must be drained before
// the server is destroyed.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/remote_source.h"
#include "common/metrics.h"
#include "common/status.h"
#include "node/tenants.h"
#include "store/tiered_store.h"

namespace kvpool {
namespace blocks {
class DescriptorTable;
}  // namespace blocks

struct LocalServerOptions {
  // Empty: the default location, /run/kvpool/kvpool.sock or a per-user
  // fallback (protocol/socket_path.h); Open() resolves it.
  std::string socket_path;
  // $XDG_RUNTIME_DIR as main read it: the second default location.
  std::string xdg_runtime_dir;
  // Socket file permissions: who on this host may use the cache.
  uint32_t socket_mode = 0660;
  // Group given the socket and the directory the node creates for it
  // (empty: the node's own group). Members may use the cache.
  std::string socket_group;
  // A world-writable socket directory (such as /tmp) lets another user take
  // the socket's name first; refused unless this is set.
  bool allow_world_writable_dir = false;
  // More connections are answered "RESOURCE_EXHAUSTED: too many
  // connections", counted, and closed.
  uint32_t max_connections = 256;
  // Connections one uid may hold at once, and one tenant (with a tenants
  // file; a tenant token's connection counts under its token's tenant):
  // more are answered "RESOURCE_EXHAUSTED: too many connections for uid U"
  // (or "... for tenant T"), counted, and closed, so one user or tenant
  // cannot take every slot from the others. 0: half of max_connections per
  // uid and three quarters per tenant.
  uint32_t max_connections_per_uid = 0;
  uint32_t max_connections_per_tenant = 0;
  // Items per request; larger batches are refused with InvalidArgument.
  uint32_t max_batch = 4096;
  // Largest frame body after the handshake (copy-mode puts carry values).
  uint32_t max_frame_bytes = 80u << 20;
  // A connection that has not completed the handshake by then is closed.
  std::chrono::milliseconds handshake_timeout{5000};
  // A connection past its handshake that sends nothing this long, holding no
  // pins or reservations and waiting for no reply, is closed (libkvpool
  // reconnects on its next call). Frees slots held by forgotten clients.
  std::chrono::milliseconds idle_timeout{300000};
  // A frame begun but not complete within this long closes the connection:
  // a client trickling a frame holds buffer memory.
  std::chrono::milliseconds frame_timeout{30000};
  // Request bytes buffered across all connections beyond the first 64 KiB
  // of each (which small requests use); a connection that would need more
  // waits until others' frames complete. A frame's body is buffered as it
  // arrives, never allocated up front from its header. Each connection
  // buffers at most one frame (max_frame_bytes plus the header).
  uint64_t max_buffered_bytes = 512ull << 20;
  // Reading from a connection pauses while this many reply bytes are queued.
  uint64_t max_output_bytes = 256ull << 20;
  // After serving a request the loop polls without sleeping this long
  // before blocking: a sleeping thread takes tens of microseconds to wake on
  // a VM, which would dominate small requests. 0 disables it.
  int64_t poll_spin_us = 50;
  // Told to clients in the handshake; changes on every node start.
  uint64_t instance_id = 0;
  // > 0: clients get the segment read-only (its fd must be sealed against
  // writes: DramOptions::seal_client_writes) and each connection a staging
  // area of this size for its reservations, copied into the segment on
  // commit. 0: clients map the segment writable and write in place.
  uint64_t client_staging_bytes = 0;
  // Threads that copy committed values from the staging areas into the
  // segment, so the loop only admits, parks and answers (a commit of less
  // than LocalOps::kInlineCopyBytes is copied by the loop). 0: the loop
  // copies every commit. -1 (auto): 2 on a host of 4 or more CPUs, else 0.
  // The hand-off costs a copy thread's wake-up and the loop's per commit
  // chunk: on 2 CPUs shared with the writing client, that costs more put
  // throughput than the loop's freed time wins (bench/README.md).
  int32_t copy_threads = -1;
  // What copy_threads resolves to on this host.
  int ResolvedCopyThreads() const;
  // Not a setting: where the default tenant's block descriptors are staged
  // (blocks/descriptor_table.h; null: they are checked and dropped).
  // Outlives the server.
  blocks::DescriptorTable* descriptors = nullptr;
  // Not a setting: answers a LookupPrefix request (hashes, timeout) by
  // calling done(status, json) once, from any thread, without blocking the
  // caller. Empty: LookupPrefix is refused.
  using PrefixDone = std::function<void(Status, std::string)>;
  std::function<void(std::vector<uint64_t>, uint32_t, PrefixDone)> lookup_prefix;

  Status Validate() const;
};

// A tenant the local server serves besides the default one: who belongs
// to it and its own store (node/tenants.h). Its entries stay on this node.
// A connected client as /api/v1/clients (kvpoolctl clients) shows it: its
// credentials and connect time fixed at the accept, its name (the hello's
// client name) and tenant at the hello, its counters advanced by the loop
// thread; any thread may read it.
struct ClientRecord {
  uint64_t id = 0;  // the connection's, unique for the server's life
  int32_t pid = 0;
  uint32_t uid = 0;
  std::chrono::system_clock::time_point connected;
  std::atomic<int> tenant{0};  // as LocalSession::tenant
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_written{0};

  void set_name(std::string name) {
    std::lock_guard lock(mu_);
    name_ = std::move(name);
  }
  std::string name() const {
    std::lock_guard lock(mu_);
    return name_;
  }

 private:
  mutable std::mutex mu_;
  std::string name_;
};

struct LocalTenant {
  TenantSpec spec;
  TieredStore* store = nullptr;  // outlives the server
  // The secrets of the spec's tokens that --client-token-file holds, by
  // name: a hello presenting one joins this tenant.
  std::map<std::string, std::array<uint8_t, 32>> token_secrets;
  // In a cluster, the tenant's remote reads and the placement of its writes
  // (the same tenant on the other nodes); null faces: this node's store
  // alone. They outlive the server.
  ClusterFaces cluster;
};

class LocalServer {
 public:
  // Prepares the socket's directory and binds (node/socket_dir.h).
  // FailedPrecondition naming the path when something serves it already, it
  // is a symbolic link, or its directory is unsafe; a stale socket file left
  // by a crash (connecting is refused) is replaced.
  // Gets of entries that are only on SSD wait (without blocking the loop)
  // for their promotion into DRAM, then are answered from DRAM. With a
  // cluster (null faces: standalone), gets and exists of keys held nowhere
  // here wait likewise for it (fetched into DRAM, or asked). A waiting
  // request keeps its decoded keys and the pins its wait took, and is
  // answered from those. The cluster's faces must outlive the server's
  // Run(). A connection belongs to the tenant its peer's credentials
  // (SO_PEERCRED, SO_PEERGROUPS) map to, else to the default tenant (store,
  // cluster); it
  // is handed that tenant's segment only, and its key ids are bound to it.
  static Result<std::unique_ptr<LocalServer>> Open(const LocalServerOptions& options,
                                                   TieredStore* store, ClusterFaces cluster,
                                                   MetricsRegistry* metrics,
                                                   std::function<std::string()> stats_json,
                                                   std::vector<LocalTenant> tenants = {});
  virtual ~LocalServer() = default;

  // Serves until Stop(). Closes every connection (releasing its pins and
  // reservations) and removes the socket file before returning.
  virtual void Run() = 0;
  virtual void Stop() = 0;
  virtual int connections() const = 0;
  // The socket's path (the resolved default when none was configured).
  virtual const std::string& socket_path() const = 0;
  // Open connections per tenant: the default tenant first, then the
  // tenants in the order given to Open.
  virtual std::vector<int> tenant_connections() const = 0;
  // The connected clients, in connection order.
  virtual std::vector<std::shared_ptr<const ClientRecord>> clients() const = 0;
};

}  // namespace kvpool
