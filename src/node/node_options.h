// NodeOptions: every setting of kvpool-node, and the one table that maps
// them to flags, the config file, --help and /api/v1/config.
// Plain data; not thread-safe to mutate, safe to read once built.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "admin/admin_server.h"
#include "cluster/anti_entropy.h"
#include "cluster/block_index.h"
#include "cluster/cluster.h"
#include "cluster/cluster_services.h"
#include "cluster/remote_reader.h"
#include "common/log.h"
#include "common/settings.h"
#include "events/kv_events.h"
#include "node/local_server.h"
#include "store/dram/dram_store.h"
#include "store/ssd/ssd_store.h"
#include "store/tiered_store.h"

namespace kvpool {

struct NodeOptions {
  std::string node_id;  // empty: the host name
  LogLevel log_level = LogLevel::kInfo;
  bool admin_enabled = true;
  // Allows binding the admin endpoint beyond loopback without authentication,
  // and the peer port without a cluster key.
  bool insecure = false;
  // The cluster key file (transport/peer_auth.h: one or two 64-hex-digit
  // keys, mode 0600 or 0400); empty: peers are not authenticated.
  std::string cluster_key_file;
  // A file whose first line is the admin endpoint's bearer token (at least
  // 16 visible characters, mode 0600 or 0400); empty: no token.
  std::string admin_token_file;
  // Remote-mode clients' tokens ("NAME HEX64" per line, mode 0600 or 0400);
  // empty: no remote client can authenticate.
  std::string client_token_file;
  // The tenants file (node/tenants.h); empty: one tenant, the default.
  std::string tenants_file;
  // Clients map the segment writable and write reservations in place;
  // false: read-only, with a staging area per connection of this size.
  bool writable_segment = false;
  uint64_t client_staging_bytes = 64ull << 20;
  DramOptions dram;
  // Most memory beyond a DRAM store's capacity for values read from other
  // nodes (DramOptions::read_room_bytes): at most an eighth of the capacity,
  // rounded up to whole slabs; 0: none. See ReadRoomFor.
  uint64_t dram_read_room = 64ull << 20;
  // Cache hints (DramOptions::hint_max_ttl): the longest TTL a retain or
  // pin may ask. The pin budget is dram.pin_max_bytes, per tenant's store.
  std::chrono::milliseconds hint_max_ttl = std::chrono::hours(24);
  // Comma-separated SSD directories; empty: DRAM only.
  std::string ssd_dirs;
  SsdOptions ssd;  // dirs filled from ssd_dirs
  TieringOptions tiering;
  // Worker threads for SSD I/O (flushes, promotions).
  int io_threads = 4;
  // Threads writing SSD regions (each keeps one region write in flight).
  int flush_threads = 4;
  // On a clean stop, write DRAM entries to SSD so a restart is warm.
  bool ssd_persist_on_stop = true;
  LocalServerOptions local;
  AdminOptions admin;
  // Peer transport and membership (etcd endpoints split out of etcd_urls).
  ClusterOptions cluster;
  std::string etcd_urls;  // comma-separated; empty: no etcd
  // Where a put is stored (cluster::Placement; reads keep no replicas
  // under kChain, whatever remote.replicas says).
  cluster::Placement placement = cluster::Placement::kLocal;
  // Placement home: bytes of hand-offs to homes in flight at once; a value
  // put beyond it stays on the writer, as with placement local.
  uint64_t placement_max_inflight = 64ull << 20;
  // Deadlines, cool-down and replicas of remote reads.
  cluster::RemoteReaderOptions remote;
  // KV events for cache-aware routers (off unless an endpoint is given).
  events::KvEventsOptions kv_events;
  // Block descriptors kept (blocks/descriptor_table.h), in bytes.
  uint64_t descriptor_bytes = 64ull << 20;
  // Lines NAMESPACE=TOPIC: read into kv_events.namespace_topics at start.
  std::string kv_events_topics_file;
  // How often holders and homes compare directory digests.
  cluster::AntiEntropyOptions anti_entropy;
  // The key homes' memory of keys dropped lately (cluster::DirectoryOptions).
  cluster::DirectoryOptions directory;
  // The block index (cluster/block_index.h) and prefix lookups.
  cluster::BlockIndexOptions block_index;
  // A prefix lookup's deadline when the caller names none.
  std::chrono::milliseconds lookup_timeout{500};

  NodeOptions() { admin.port = 9710; }
  Status Validate() const;
  // The SSD options with dirs split out of ssd_dirs.
  SsdOptions SsdWithDirs() const;
  // The DRAM options of a store of capacity_bytes (the node's own or a
  // tenant's), with its read room: dram_read_room, at most an eighth of the
  // capacity, rounded up to whole slabs; sealed unless writable_segment.
  DramOptions DramFor(uint64_t capacity_bytes) const;
  // The cluster options with node id and etcd endpoints filled in.
  ClusterOptions ClusterWithEndpoints(const std::string& node_id) const;
};

// Whether a bind address is loopback-only ("127.x", "::1", "localhost").
bool IsLoopbackAddress(const std::string& address);

// Binds every field of *options to a row of the table. *options must outlive
// the table.
void BuildNodeSettings(NodeOptions* options, SettingsTable* table);

}  // namespace kvpool
