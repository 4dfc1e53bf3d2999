#include "node/node_options.h"

#include <fmt/format.h>

namespace kvpool {

namespace {

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    if (comma > start) out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace

bool IsLoopbackAddress(const std::string& a) {
  return a == "::1" || a == "localhost" || a.starts_with("127.");
}

ClusterOptions NodeOptions::ClusterWithEndpoints(const std::string& id) const {
  ClusterOptions c = cluster;
  c.node_id = id;
  c.etcd = SplitCommas(etcd_urls);
  return c;
}

namespace {

// A ZMQ endpoint only this host reaches: ipc://, inproc://, or tcp:// on a
// loopback address.
bool IsLocalEndpoint(const std::string& e) {
  if (e.starts_with("ipc://") || e.starts_with("inproc://")) return true;
  if (!e.starts_with("tcp://")) return false;
  std::string host = e.substr(6, e.rfind(':') == std::string::npos ? std::string::npos
                                                                   : e.rfind(':') - 6);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return IsLoopbackAddress(host);
}

}  // namespace

Status NodeOptions::Validate() const {
  KVPOOL_RETURN_IF_ERROR(dram.Validate());
  KVPOOL_RETURN_IF_ERROR(kv_events.Validate());
  KVPOOL_RETURN_IF_ERROR(block_index.Validate());
  for (const std::string* e : {&kv_events.endpoint, &kv_events.replay_endpoint}) {
    if (!e->empty() && !IsLocalEndpoint(*e) && !insecure) {
      return InvalidArgument(fmt::format(
          "KV events endpoint {} is reachable from other hosts and events are not "
          "authenticated: bind it to a loopback address (tcp://127.0.0.1:PORT) or ipc://, or "
          "pass --insecure",
          *e));
    }
  }
  KVPOOL_RETURN_IF_ERROR(tiering.Validate());
  KVPOOL_RETURN_IF_ERROR(anti_entropy.Validate());
  if (!writable_segment && client_staging_bytes < dram.max_value_bytes) {
    return InvalidArgument(fmt::format(
        "--client-staging-bytes {} is smaller than --max-value-size {}: the largest value "
        "could not be reserved",
        client_staging_bytes, dram.max_value_bytes));
  }
  if (!ssd_dirs.empty()) {
    if (ssd.capacity_bytes == 0) return InvalidArgument("--ssd needs --ssd-capacity");
    KVPOOL_RETURN_IF_ERROR(SsdWithDirs().Validate());
  }
  KVPOOL_RETURN_IF_ERROR(local.Validate());
  if (admin_enabled) {
    KVPOOL_RETURN_IF_ERROR(admin.Validate());
    if (!IsLoopbackAddress(admin.bind_address) && admin_token_file.empty() && !insecure) {
      return InvalidArgument(fmt::format(
          "--admin-address {} is not loopback: give a bearer token (--admin-token-file) so "
          "the admin endpoint is authenticated, or pass --insecure to run without",
          admin.bind_address));
    }
  }
  ClusterOptions co = ClusterWithEndpoints(node_id.empty() ? "node" : node_id);
  if (co.enabled()) {
    KVPOOL_RETURN_IF_ERROR(co.Validate());
    // Loopback included: on a multi-user host any local user reaches a
    // loopback peer port, past the socket's permissions.
    if (cluster_key_file.empty() && !insecure) {
      return InvalidArgument(fmt::format(
          "a node with a peer port ({} on {}) needs the cluster key, loopback included, or any "
          "local user can read and write through it: make one with `openssl rand -hex 32 > "
          "/etc/kvpool/cluster.key && chmod 600 /etc/kvpool/cluster.key`, give every node the "
          "same file with --cluster-key-file, or pass --insecure to run without",
          co.peers.empty() ? "--etcd" : "--peers", co.transport.listen_host));
    }
    if (co.transport.peer_encryption && cluster_key_file.empty()) {
      return InvalidArgument(
          "--peer-encryption needs --cluster-key-file: the connections' keys come from the "
          "cluster-key handshake");
    }
  }
  if (local.max_frame_bytes < dram.max_value_bytes + 64 * 1024) {
    return InvalidArgument(fmt::format(
        "--max-frame ({}) must exceed --max-value-size ({}) by at least 64KiB",
        SettingsTable::FormatBytes(local.max_frame_bytes),
        SettingsTable::FormatBytes(dram.max_value_bytes)));
  }
  return Status::Ok();
}

SsdOptions NodeOptions::SsdWithDirs() const {
  SsdOptions so = ssd;
  so.dirs = SplitCommas(ssd_dirs);
  so.max_value_bytes = dram.max_value_bytes;
  return so;
}

DramOptions NodeOptions::DramFor(uint64_t capacity_bytes) const {
  DramOptions d = dram;
  d.capacity_bytes = capacity_bytes;
  d.seal_client_writes = !writable_segment;
  d.max_value_bytes = std::min(d.max_value_bytes, capacity_bytes);
  const uint64_t room = std::min(dram_read_room, capacity_bytes / 8);
  d.read_room_bytes = (room + d.slab_bytes - 1) / d.slab_bytes * d.slab_bytes;
  d.hint_max_ttl = hint_max_ttl;
  return d;
}

void BuildNodeSettings(NodeOptions* o, SettingsTable* t) {
  t->AddString("node-id", &o->node_id, "This node's name in the cluster (default: the host name)");
  t->AddEnum("log-level", &o->log_level, kLogLevelNames, "Log verbosity");

  t->AddString("socket", &o->local.socket_path,
               "Unix socket that local engines connect to (empty: /run/kvpool/kvpool.sock, else "
               "$XDG_RUNTIME_DIR/kvpool/kvpool.sock, else /tmp/kvpool-$UID/kvpool.sock: the "
               "first directory this user may create or use)");
  t->AddString("socket-group", &o->local.socket_group,
               "Group given the socket and its directory when the node creates it (empty: the "
               "node's own group); its members may use the cache");
  t->AddBool("socket-allow-world-writable-dir", &o->local.allow_world_writable_dir,
             "Allow the socket in a world-writable directory such as /tmp, where another user "
             "can take its name first");
  t->AddBytes("dram-capacity", &o->dram.capacity_bytes, 16ull << 20, 1ull << 42,
              "DRAM the cache holds values in (the shared segment is this plus the read room; "
              "pre-faulted at start)");
  t->AddBytes("dram-read-room", &o->dram_read_room, 0, 1ull << 40,
              "DRAM beyond the capacity for values read from other nodes: such a value, "
              "fetched for one read, takes a free slot there before it evicts anything; at "
              "most an eighth of the capacity, rounded up to whole slabs (0: none)");
  t->AddBytes("slab-size", &o->dram.slab_bytes, 1ull << 20, 1ull << 30,
              "Unit of memory moved between size classes");
  t->AddBytes("max-value-size", &o->dram.max_value_bytes, 4096, 1ull << 30,
              "Largest value accepted");
  t->AddEnum("eviction", &o->dram.eviction, {kEvictionPolicies.begin(), kEvictionPolicies.end()},
             "DRAM eviction policy (prefix: made for LLM prefix traffic, its protected share "
             "chosen by sampled shadow caches, docs/eviction.md; s3fifo, lru, prefix-fixed -- "
             "prefix at a fixed 70% --, slru -- that without ageing -- and tinylfu -- "
             "W-TinyLFU -- for comparison)");
  t->AddBytes("pin-max-bytes", &o->dram.pin_max_bytes, 0, 1ull << 50,
              "Cache hints: values that pins (POST /api/v1/hints, op pin) may hold in DRAM at "
              "once, per tenant's store; a pin past it is refused (0: no pins)");
  t->AddInt("retain-max-percent", &o->dram.retain_max_percent, 1, 100,
            "Cache hints: the most of each store's DRAM capacity retained values may take; past "
            "it, the retentions first in line to go end");
  t->AddDuration("hint-max-ttl", &o->hint_max_ttl, std::chrono::milliseconds(1),
                 std::chrono::hours(24 * 7),
                 "Cache hints: the longest TTL a retain or pin may ask; a longer one is refused");
  t->AddBool("writable-segment", &o->writable_segment,
             "Hand clients the segment writable, so they write reservations in place (saves "
             "one copy per zero-copy put, but any client can then change committed values); "
             "by default clients map it read-only and write through a staging area");
  t->AddBytes("client-staging-bytes", &o->client_staging_bytes, 1ull << 20, 1ull << 34,
              "Per local connection: staging memory its reservations are written to (one "
              "reserve batch must fit; pages are allocated when first written)");
  t->AddBool("huge-pages", &o->dram.huge_pages,
             "Back the segment with huge pages when the system has them");
  t->AddBool("prefault", &o->dram.prefault, "Touch the whole segment at start");

  t->AddString("ssd", &o->ssd_dirs,
               "SSD tier directories, comma-separated (one per NVMe drive); empty: DRAM only");
  t->AddBytes("ssd-capacity", &o->ssd.capacity_bytes, 0, 1ull << 50,
              "SSD tier size across all directories (preallocated)");
  t->AddBytes("ssd-region-size", &o->ssd.region_bytes, 1ull << 20, 1ull << 30,
              "SSD write and reclaim unit (larger: fewer, bigger writes)");
  t->AddInt("ssd-buffers", &o->ssd.buffers_per_dir, 2, 64,
            "Region buffers per SSD directory (absorb bursts of demotions)");
  t->AddInt("ssd-reinsert-reads", &o->ssd.reinsert_min_reads, 0, 1000000,
            "Reclaiming a region keeps entries read at least this often (0: never)");
  t->AddInt("ssd-admit-reads", &o->tiering.admit_min_reads, 0, 15,
            "Demote to SSD only entries read at least this often (0: all)");
  t->AddBool("ssd-demote-in-place", &o->tiering.demote_in_place,
             "Demote DRAM evictions to SSD without copying them under the DRAM lock: the "
             "slot is held until the region's flush copies it, or (huge-page segment, values "
             "of 256 KiB and more) writes it straight from DRAM");
  t->AddBool("ssd-wipe-other-format", &o->ssd.wipe_other_format,
             "Start with an SSD directory written in another on-disk format version by wiping "
             "it (the SSD tier starts empty); without it such a directory stops the start "
             "with a message saying so");
  t->AddDuration("ssd-insert-wait", &o->ssd.insert_wait, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(10000),
                 "How long a put (or promotion) waits, before it takes the DRAM lock, for "
                 "SSD buffer room for the demotions it causes (throttles writers to the SSD's "
                 "speed); a demotion that still finds no room is dropped and counted");
  t->AddInt("io-threads", &o->io_threads, 1, 64, "Worker threads for SSD reads (promotions)");
  t->AddInt("ssd-flush-threads", &o->flush_threads, 1, 64,
            "Threads writing SSD regions (one region write in flight each)");
  t->AddBool("ssd-persist-on-stop", &o->ssd_persist_on_stop,
             "On a clean stop, write DRAM entries to SSD so the restart is warm");

  t->AddInt("max-connections", &o->local.max_connections, 1, 65536,
            "Local client connections accepted at once; more are refused and counted");
  t->AddInt("max-connections-per-uid", &o->local.max_connections_per_uid, 0, 65536,
            "Local connections one uid may hold at once (0: half of --max-connections); "
            "more are refused with RESOURCE_EXHAUSTED and counted");
  t->AddInt("max-connections-per-tenant", &o->local.max_connections_per_tenant, 0, 65536,
            "With tenants: local connections one tenant may hold at once (0: three quarters "
            "of --max-connections); more are refused with RESOURCE_EXHAUSTED and counted");
  t->AddInt("max-batch", &o->local.max_batch, 1, 4096, "Items per request");
  t->AddBytes("max-frame", &o->local.max_frame_bytes, 64 * 1024, 2ull << 30,
              "Largest request body after the handshake (copy-mode puts carry values)");
  t->AddDuration("handshake-timeout", &o->local.handshake_timeout, std::chrono::milliseconds(100),
                 std::chrono::milliseconds(600000),
                 "Connections that do not complete the handshake in time are closed");
  t->AddDuration("idle-timeout", &o->local.idle_timeout, std::chrono::milliseconds(100),
                 std::chrono::milliseconds(86400000),
                 "Local connections that send nothing this long and hold no pins or reservations "
                 "are closed (clients reconnect); frees slots of forgotten clients");
  t->AddDuration("frame-timeout", &o->local.frame_timeout, std::chrono::milliseconds(100),
                 std::chrono::milliseconds(600000),
                 "A request frame begun but not completed within this long closes its connection");
  t->AddBytes("max-buffered", &o->local.max_buffered_bytes, 1ull << 20, 1ull << 40,
              "Request bytes buffered across all local connections beyond 64KiB each (at least "
              "one --max-frame); a connection needing more waits");

  t->AddInt("copy-threads", &o->local.copy_threads, -1, 64,
            "Threads copying committed values from clients' staging areas into the segment, so "
            "the local loop moves no bytes of a large commit (0: the loop copies; -1: 2 on a host "
            "of 4 or more CPUs, else 0)");
  t->AddInt("poll-spin-us", &o->local.poll_spin_us, 0, 10000,
            "Microseconds the socket loop polls without sleeping after a request (0: never)");
  t->AddBool("admin", &o->admin_enabled, "Serve the admin HTTP endpoint (metrics, dashboard)");
  t->AddString("admin-address", &o->admin.bind_address,
               "Admin HTTP bind address (loopback: the endpoint is not authenticated)");
  t->AddInt("admin-port", &o->admin.port, 0, 65535, "Admin HTTP port (0 picks a free one)");
  t->AddBool("insecure", &o->insecure,
             "Allow unauthenticated endpoints on non-loopback addresses");
  t->AddString("admin-token-file", &o->admin_token_file,
               "File with the admin endpoint's bearer token (first line, 16+ visible "
               "characters), mode 0600; every path but /healthz and /readyz then needs it");
  t->AddString("client-token-file", &o->client_token_file,
               "File of remote-mode clients' tokens, one \"NAME HEX64\" per line, mode 0600; "
               "a client holding one may look up, fetch, store and list members");
  t->AddString("tenants-file", &o->tenants_file,
               "File of tenants, one \"tenant NAME dram=SIZE [ssd=SIZE] [uids=...] [gids=...]\" "
               "per line: local clients of those users or groups get the tenant's own segment, "
               "quotas and key space; everyone else is the default tenant");
  t->AddString("cluster-key-file", &o->cluster_key_file,
               "File with the cluster key (64 hex digits; a second line during rotation), mode "
               "0600; every peer connection is authenticated with it");
  t->AddBool("accept-unproven-members", &o->cluster.accept_unproven_members,
             "With etcd and a cluster key: also count members whose registration carries no "
             "proof of the key (nodes of a version before proofs), for a rolling upgrade from "
             "such a version; turn off once every node is upgraded");
  t->AddBool("peer-encryption", &o->cluster.transport.peer_encryption,
             "Encrypt peer connections (AES-256-GCM, keys from the cluster-key handshake); a "
             "connection is encrypted when either side asks");
  t->AddInt("admin-threads", &o->admin.threads, 1, 16, "Admin HTTP request threads");
  t->AddInt("admin-max-connections", &o->admin.max_connections, 1, 1000000,
            "Admin HTTP connections open at once; a new one replaces the oldest still waiting "
            "for its request");
  t->AddDuration("admin-request-timeout", &o->admin.request_timeout, std::chrono::milliseconds(100),
                 std::chrono::milliseconds(600000),
                 "Time an admin HTTP connection has to send its request, and again to take the "
                 "response; slower ones are closed");
  t->AddInt("admin-max-queued", &o->admin.max_queued_requests, 1, 100000,
            "Admin requests (all but /healthz and /readyz) waiting for a request thread; "
            "more are answered 503");

  t->AddString("peer-address", &o->cluster.transport.listen_host,
               "Peer transport (UCX) bind address (loopback unless --insecure)");
  t->AddInt("peer-port", &o->cluster.transport.listen_port, 0, 65535,
            "Peer transport port (0: any free port; needed with --peers)");
  t->AddInt("peer-spin-us", &o->cluster.transport.progress_spin, 0, 10000,
            "Microseconds the peer transport polls after work before it sleeps (0: never)");
  t->AddDuration("peer-idle-close", &o->cluster.transport.idle_close, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(86400000),
                 "Close an outgoing peer connection after this long with no call in flight (0: "
                 "never); the next call to that peer connects again");
  t->AddInt("peer-max-connections", &o->cluster.transport.max_endpoints, 1, 1000000,
            "Peer connections open at most, both directions; at the limit a new outgoing one "
            "first closes the least recently used idle one");
  t->AddString("peer-net-devices", &o->cluster.transport.net_devices,
               "UCX devices for peer traffic, e.g. mlx5_0:1 (empty: the interface of "
               "--peer-address; all when it is a wildcard)");
  t->AddString("etcd", &o->etcd_urls,
               "etcd endpoints for membership, comma-separated (http://host:port, or "
               "https://host:port for TLS)");
  t->AddString("etcd-user", &o->cluster.etcd_security.user,
               "etcd user when etcd's own auth is on (etcdctl auth enable); needs "
               "--etcd-password-file");
  t->AddString("etcd-password-file", &o->cluster.etcd_security.password_file,
               "File whose first line is --etcd-user's password, mode 0600, owned by the node's "
               "user");
  t->AddString("etcd-ca-file", &o->cluster.etcd_security.ca_file,
               "PEM CA that signed etcd's server certificate, for https endpoints (empty: the "
               "system's CAs)");
  t->AddString("etcd-cert-file", &o->cluster.etcd_security.cert_file,
               "PEM client certificate presented to etcd (etcd's --client-cert-auth); needs "
               "--etcd-key-file");
  t->AddString("etcd-key-file", &o->cluster.etcd_security.key_file,
               "Unencrypted PEM private key of --etcd-cert-file");
  t->AddString("peers", &o->cluster.peers,
               "Static member list id=host:port[*weight],... (without etcd)");
  t->AddString("cluster", &o->cluster.cluster, "Cluster name (separates clusters on one etcd)");
  t->AddDuration("lease-ttl", &o->cluster.lease_ttl, std::chrono::milliseconds(2000),
                 std::chrono::milliseconds(600000),
                 "Membership lease TTL: a dead node leaves the view after this long");
  t->AddDuration("peer-lookup-timeout", &o->remote.lookup_timeout, std::chrono::milliseconds(10),
                 std::chrono::milliseconds(60000),
                 "Deadline of a directory lookup at a key's home (a late answer is a miss)");
  t->AddDuration("peer-fetch-timeout", &o->remote.fetch_timeout, std::chrono::milliseconds(10),
                 std::chrono::milliseconds(60000),
                 "Deadline of fetching one value from a peer (a late answer is a miss)");
  t->AddDuration("peer-cooldown", &o->remote.cooldown, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(600000),
                 "How long a peer that failed or timed out is avoided");
  t->AddDuration("peer-lookup-cache-ttl", &o->remote.lookup_cache_ttl, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(60000),
                 "How long a positive directory answer is reused (0: ask the home every time); "
                 "halved each time a fetch finds the value gone from the holders a cached answer "
                 "named, grown back by fetches served");
  t->AddInt("directory-ghost", &o->directory.ghost_ratio, 0, 16,
            "Each key home remembers keys no node holds any more over a window of this many "
            "times the keys it lists (2 bytes a key), and a writer that puts one again keeps it "
            "as a block coming back (0: off)");
  t->AddDuration("anti-entropy-interval", &o->anti_entropy.interval, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(3600000),
                 "How often each node compares digests of what it holds with the keys' homes "
                 "and repairs the difference (0: never); bounds how long a lost publish hides "
                 "a key");
  t->AddEnum("placement", &o->placement, cluster::kPlacementNames,
             "Where a put is stored: the writer's node (local), the key's home node (home), or "
             "the node holding the rest of its prefix chain, with reads of other nodes' values "
             "kept no longer than the read (chain: a pool that keeps what one cache would; "
             "docs/eviction.md)");
  t->AddEnum("read-replicas", &o->remote.replicas, cluster::RemoteReaderOptions::kReplicasNames,
             "Which values a read fetches from other nodes are kept here as replicas (first in "
             "line to go under the prefix policy): every one (all), those this node fetched "
             "already within its last "
             "--read-replica-window fetched values (repeat: values read here again soon, such "
             "as a shared prompt), or none; a value not kept is dropped after its read. "
             "Placement chain keeps none, whatever this says");
  t->AddInt("read-replica-window", &o->remote.replica_window, 1, 1 << 20,
            "--read-replicas repeat: how many of the last fetched values are remembered "
            "(about 100 bytes each)");
  t->AddBytes("placement-max-inflight", &o->placement_max_inflight, 1ull << 20, 1ull << 40,
              "Placement home and chain: value bytes being handed to other nodes at once; a put "
              "beyond it stays "
              "on the writer (as placement local) instead of filling its DRAM with pinned values");
  t->AddBytes("descriptor-bytes", &o->descriptor_bytes, 1ull << 20, 1ull << 40,
              "Memory for the block descriptors writers attach to their puts (KV events and "
              "prefix lookups name described blocks the engine's way, about 150 bytes a block "
              "of 16 tokens); a descriptor beyond it is not kept (counted)");
  t->AddInt("block-index-entries", &o->block_index.max_entries, 1024, 1ull << 32,
            "Index keys this node keeps as a home of the block index that answers routers' "
            "prefix lookups (2 per engine block and tier held in the cluster, about 100 bytes "
            "each); beyond it new blocks are not indexed here");
  t->AddInt("lookup-max-hashes", &o->block_index.max_hashes, 1, 65536,
            "Engine block hashes one prefix lookup may carry");
  t->AddDuration("lookup-timeout", &o->lookup_timeout, std::chrono::milliseconds(1),
                 std::chrono::milliseconds(10000),
                 "A prefix lookup's deadline when the caller names none (homes that do not "
                 "answer by then count as holding nothing)");
  t->AddString("kv-events-endpoint", &o->kv_events.endpoint,
               "ZMQ endpoint where the node publishes KV events of what it holds, for "
               "cache-aware routers, e.g. tcp://127.0.0.1:5557 (empty: no events; "
               "docs/kv-events.md)");
  t->AddString("kv-events-replay-endpoint", &o->kv_events.replay_endpoint,
               "ZMQ endpoint of the KV events replay socket, from which a subscriber fetches "
               "batches it missed (empty: no replay)");
  t->AddString("kv-events-topic", &o->kv_events.topic,
               "Topic frame of every KV event message; routers that index pods (llm-d) read "
               "kv@<pod>@<model>");
  t->AddString("kv-events-topics-file", &o->kv_events_topics_file,
               "A file of lines NAMESPACE=TOPIC: the KV events of a namespace's blocks go on "
               "that topic (kv@<pod>@<model>, so a router files a model's blocks under it), the "
               "others on --kv-events-topic");
  t->AddEnum("kv-events-hash", &o->kv_events.hash_type, events::kHashTypeNames,
             "How KV events write block hashes: a 64-bit int (vLLM's int mode, Dynamo), bytes, "
             "or as the writer's block descriptor has them; a key put without a descriptor is "
             "named by its key id (int: its high 64 bits; bytes: all 16)");
  t->AddEnum("kv-events-replay-frames", &o->kv_events.replay_framing, events::kReplayFramingNames,
             "KV events replay answers as [topic, seq, payload] (3, today's vLLM subscriber) or "
             "[seq, payload] (2, older subscribers)");
  t->AddEnum("kv-events-encoding", &o->kv_events.encoding, events::kEncodingNames,
             "KV events as maps of their fields (vLLM 0.26+) or as arrays in field order");
  t->AddDuration("kv-events-batch-interval", &o->kv_events.batch_interval,
                 std::chrono::milliseconds(1), std::chrono::milliseconds(10000),
                 "How long KV events gather into one batch (message)");
  t->AddInt("kv-events-queue", &o->kv_events.max_queued_events, 1, 100000000,
            "KV events waiting for their batch; beyond it events are dropped and counted");
  t->AddInt("kv-events-replay-batches", &o->kv_events.replay_batches, 0, 1000000,
            "KV event batches kept for the replay socket");
  t->AddBytes("kv-events-replay-bytes", &o->kv_events.replay_bytes, 0, uint64_t{1} << 40,
              "Most bytes of KV event batches kept for the replay socket (the oldest go first)");
  t->AddInt("kv-events-batch-blocks", &o->kv_events.max_batch_keys, 1, 1000000,
            "Most blocks in one KV event batch");
  t->AddBytes("kv-events-batch-bytes", &o->kv_events.max_batch_bytes, 4096, uint64_t{1} << 30,
              "A KV event batch is sent once it holds about this many bytes");
  t->AddInt("kv-events-hwm", &o->kv_events.send_hwm, 1, 1000000,
            "KV event batches queued for a subscriber before further batches are dropped for "
            "it (and counted)");
}

}  // namespace kvpool
