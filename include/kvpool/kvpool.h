/* kvpool.h: the C ABI of the kvpool client library (libkvpool.so).
 *
 * A kvpool_client talks to the kvpool-node on this host over a Unix socket
 * and maps the node's shared DRAM segment (read-only unless the node runs
 * with --writable-segment), so a get moves bytes with one memcpy (or none,
 * with the zero-copy calls). A put's bytes go to the connection's staging
 * area, from which the node copies them into the segment on commit.
 *
 * Thread-safety: a kvpool_client is thread-safe; concurrent calls use
 * separate connections from the client's pool.
 * Ownership: the library never keeps a caller's pointer after a call
 * returns, except the segment pointers handed out by kvpool_reserve and
 * kvpool_acquire, which stay valid until kvpool_commit/kvpool_abort or
 * kvpool_release (or kvpool_close) for that handle.
 * Keys: a key is (namespace, key), both arbitrary bytes with explicit
 * lengths. Batch calls take 128-bit key ids made by kvpool_key_ids, so a key
 * is hashed once.
 * Errors: every call returns a kvpool_status; batch calls also fill one
 * status per item. kvpool_last_error() describes the last failure on the
 * calling thread.
 */
#ifndef KVPOOL_KVPOOL_H_
#define KVPOOL_KVPOOL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVPOOL_API __attribute__((visibility("default")))

typedef int32_t kvpool_status;
enum {
  KVPOOL_OK = 0,
  KVPOOL_NOT_FOUND = 1,           /* a miss */
  KVPOOL_ALREADY_EXISTS = 2,      /* key committed already; first writer won */
  KVPOOL_INVALID_ARGUMENT = 3,    /* malformed request; do not retry */
  KVPOOL_UNAVAILABLE = 4,         /* node not reachable; retry later */
  KVPOOL_RESOURCE_EXHAUSTED = 5,  /* out of space or over a limit */
  KVPOOL_FAILED_PRECONDITION = 6,
  KVPOOL_ABORTED = 7,
  KVPOOL_DEADLINE_EXCEEDED = 8,   /* the call's timeout passed */
  KVPOOL_CORRUPTION = 9,
  KVPOOL_IO_ERROR = 10,
  KVPOOL_INTERNAL = 11,
  KVPOOL_PERMISSION_DENIED = 12  /* credentials or tenant do not allow it */
};

/* Name of a status code, e.g. "NotFound". Static storage. */
KVPOOL_API const char* kvpool_status_name(kvpool_status status);
/* Library version, "MAJOR.MINOR.PATCH". Static storage. */
KVPOOL_API const char* kvpool_version(void);
/* Message of the last failed call on this thread; "" when none. Valid until
 * the next kvpool call on this thread. */
KVPOOL_API const char* kvpool_last_error(void);

typedef struct kvpool_client kvpool_client;

typedef struct kvpool_key_id {
  uint64_t hi;
  uint64_t lo;
} kvpool_key_id;

/* Options grow at the end; struct_size tells the library which fields the
 * caller knows. Always start from kvpool_options_init. */
typedef struct kvpool_options {
  uint32_t struct_size;
  /* Unix socket of the local node. NULL: the node's default, the first of
   * /run/kvpool/kvpool.sock, $XDG_RUNTIME_DIR/kvpool/kvpool.sock and
   * /tmp/kvpool-<uid>/kvpool.sock where a socket exists. */
  const char* socket_path;
  /* Deadline of each call, in milliseconds (> 0). Default 5000. */
  uint32_t timeout_ms;
  /* Most connections the client opens to the node (>= 1). Default 8. */
  uint32_t max_connections;
  /* Reconnect after the node restarts (1) or fail with UNAVAILABLE (0). Default 1. */
  uint32_t reconnect;
  /* 1: move bytes through the socket instead of mapping the shared segment
   * (for processes that cannot map it). Zero-copy calls then fail with
   * FAILED_PRECONDITION. Default 0. */
  uint32_t copy_mode;
  /* Microseconds to poll for a reply before sleeping: waking a sleeping
   * thread costs tens of microseconds on VMs, which dominates small calls.
   * 0 never polls. Default 50. */
  uint32_t spin_us;
  /* Remote mode, for a host without a node: the peer addresses of one or
   * more cluster nodes, "host:port[,host:port]" (the nodes' --peer-port;
   * any one live node is enough). Non-NULL selects remote mode: the client
   * learns the membership from those nodes, computes the shard map itself
   * and talks the peer protocol (UCX; UCX_TLS from the environment) to the
   * keys' homes; socket_path, max_connections, reconnect, copy_mode and
   * spin_us are ignored. In remote mode: put stores each value on its key's
   * home (ALREADY_EXISTS is reported as OK); get looks the key up at its
   * home and fetches it from a holder straight into the caller's buffer;
   * exists asks the homes; a home that does not answer makes its keys
   * misses (get, exists) or UNAVAILABLE (put), and the call fails
   * UNAVAILABLE when no node answers. The zero-copy calls, remove, flush and
   * stats_json fail with FAILED_PRECONDITION. NULL: local mode. Default NULL. */
  const char* remote_peers;
  /* Remote mode: how often the membership is refreshed (ms); it is also
   * refreshed whenever a node does not answer. Default 2000. */
  uint32_t remote_refresh_ms;
  /* The uid the node must run as, checked (SO_PEERCRED) before anything is
   * sent to it or mapped from it; a node of another uid is refused with
   * FAILED_PRECONDITION. -1 (the default): what the socket's directory
   * promises, checked before connecting, as the node checks it: a per-user
   * directory ($XDG_RUNTIME_DIR/kvpool, /tmp/kvpool-<uid>) must be a real
   * directory owned by this user (/tmp/kvpool-<uid> with mode 0700), and
   * its node must run as this user; any other directory (/run/kvpool, an
   * explicit path) must be a real directory owned by root, by this user or
   * by the service user "kvpool", not writable by others, and its node must
   * run as its owner or root (a root-owned one: also the service user). A directory that breaks these rules (another user may have
   * made it to take the socket's name) is refused with FAILED_PRECONDITION
   * naming the path, its owner and mode, and nothing is sent. */
  int64_t expected_server_uid;
  /* Remote mode: a client token file, "NAME HEX64" on its first line (mode
   * 0600, owned by this user), for clusters whose nodes hold a cluster key:
   * the client authenticates with it and may then look up, fetch, store and
   * list members. NULL: no token (such clusters answer PERMISSION_DENIED).
   * Default NULL. */
  const char* remote_token_file;
  /* Local mode: a tenant token file, "NAME HEX64" on its first line (mode
   * 0600, owned by this user; the node's --client-token-file holds the same
   * line and its tenants file lists NAME under a tenant's tokens=). The
   * handshake presents it and the node serves this client as that tenant,
   * whatever its uid. A token the node does not know: kvpool_open fails
   * with PERMISSION_DENIED. NULL: the tenant this process's uid or groups
   * map to. Default NULL. */
  const char* tenant_token_file;
  /* Local mode: the name this client gives the node in its handshake, shown
   * by `kvpoolctl clients` with its pid, user, tenant and traffic, e.g.
   * "vllm worker tp0". At most 256 bytes are kept. NULL: the program's name.
   * Default NULL. */
  const char* client_name;
  /* What a client opened before fork() does in the child (see "Fork" below):
   * KVPOOL_AFTER_FORK_RECONNECT (the default): the child's first call opens
   * connections of its own, and the child never uses the parent's;
   * KVPOOL_AFTER_FORK_FAIL: every call in the child fails with
   * FAILED_PRECONDITION (the child opens its own client). */
  uint32_t after_fork;
} kvpool_options;

#define KVPOOL_AFTER_FORK_RECONNECT 0u
#define KVPOOL_AFTER_FORK_FAIL 1u

KVPOOL_API void kvpool_options_init(kvpool_options* options);

/* Fork. A client may be used by one process only: a child of fork() never
 * uses its parent's connections, mapped segment, staging areas, regions or
 * handles. In the child the library closes the parent's connections and
 * unmaps the parent's mappings (pthread_atfork) before the child runs on; a
 * client opened in the parent then, at the child's first call on it, opens
 * connections of its own to the same socket with the same settings
 * (KVPOOL_SOCKET and the other options as given to kvpool_open), or fails
 * with FAILED_PRECONDITION under KVPOOL_AFTER_FORK_FAIL. The parent is not
 * affected. Regions and handles obtained before the fork are invalid in the
 * child (their memory is unmapped there); kvpool_close in the child frees
 * only the child's part. A remote-mode client cannot follow a fork: its
 * calls in the child fail with FAILED_PRECONDITION (open a new client).
 * No kvpool call is async-signal-safe: call none from a signal handler, nor
 * between fork() and exec() in a child of a multi-threaded process. */

/* Connects to the node (remote mode: asks the remote_peers for the
 * membership). On failure returns NULL with *status set (UNAVAILABLE
 * when no node listens) and kvpool_last_error() telling why. */
KVPOOL_API kvpool_client* kvpool_open(const kvpool_options* options, kvpool_status* status);
/* Releases every reservation and pin of the client, then frees it. NULL is ignored. */
KVPOOL_API void kvpool_close(kvpool_client* client);

/* Computes the ids of n keys in one namespace: out[i] = id(ns, keys[i]). */
KVPOOL_API void kvpool_key_ids(const void* ns, size_t ns_len, const void* const* keys,
                               const size_t* key_lens, size_t n, kvpool_key_id* out);

/* ---- Copy mode: bytes from and into caller buffers. ---------------------
 * Batch put: stores n values. statuses[i]: OK, ALREADY_EXISTS (kept the first
 * value), INVALID_ARGUMENT (size 0 or over the node's maximum),
 * RESOURCE_EXHAUSTED. Returns OK when every item was OK or ALREADY_EXISTS,
 * else the first failing item's status (or the call's, e.g. UNAVAILABLE). */
KVPOOL_API kvpool_status kvpool_put(kvpool_client* client, const kvpool_key_id* ids,
                                    const void* const* values, const uint64_t* sizes, size_t n,
                                    kvpool_status* statuses);
/* Batch get into caller buffers of capacities[i] bytes. sizes[i] gets the
 * value's size. statuses[i]: OK, NOT_FOUND, RESOURCE_EXHAUSTED (buffer too
 * small; sizes[i] tells the size needed). Returns OK when the call ran (items
 * may still miss), or the call's failure. */
KVPOOL_API kvpool_status kvpool_get(kvpool_client* client, const kvpool_key_id* ids,
                                    void* const* buffers, const uint64_t* capacities, size_t n,
                                    uint64_t* sizes, kvpool_status* statuses);
/* Batch exists: hits[i] = 1 when cached, else 0; *prefix_len = number of
 * leading hits (engines load prefixes). Either output may be NULL. */
KVPOOL_API kvpool_status kvpool_exists(kvpool_client* client, const kvpool_key_id* ids, size_t n,
                                       uint8_t* hits, size_t* prefix_len);
/* Drops keys from the cache. statuses[i]: OK or NOT_FOUND. */
KVPOOL_API kvpool_status kvpool_remove(kvpool_client* client, const kvpool_key_id* ids, size_t n,
                                       kvpool_status* statuses);

/* ---- Block descriptors. -------------------------------------------------
 * A put or reserve may say, per key, which engine block the value is, so
 * the node's KV events (docs/kv-events.md) name it the way the engine's
 * own events do: its block hash, parent hash, token ids, block size, group,
 * LoRA name and cache spec kind. A descriptor is a byte string in the
 * format of docs/kv-events.md ("Block descriptors"; at most 16,896 bytes).
 * The node keeps it with the entry while a tier holds it (where events are
 * on; else it is checked and dropped). A malformed descriptor fails its
 * item with INVALID_ARGUMENT and its value is not stored: a value is
 * stored with the descriptor it came with or not at all. Remote mode drops
 * descriptors (no node keeps them). */
typedef struct kvpool_descriptor {
  const void* data;
  uint64_t size; /* 0: this key has none */
} kvpool_descriptor;

/* kvpool_put with descs[i] the descriptor of ids[i] (descs may be NULL). */
KVPOOL_API kvpool_status kvpool_put_described(kvpool_client* client, const kvpool_key_id* ids,
                                              const void* const* values, const uint64_t* sizes,
                                              const kvpool_descriptor* descs, size_t n,
                                              kvpool_status* statuses);

/* ---- Zero-copy: read the shared segment in place; write a reservation
 * where the node says (the connection's staging area, or the segment
 * itself with --writable-segment). ---------------------------------------- */
typedef struct kvpool_region {
  void* data;      /* acquire: into the mapped segment; reserve: where to write */
  uint64_t size;
  uint64_t handle; /* for commit/abort/release; 0 when the item failed */
} kvpool_region;

/* Reserves n slots. For each OK item, write exactly regions[i].size bytes at
 * regions[i].data, then kvpool_commit. statuses[i]: OK, ALREADY_EXISTS (no
 * write needed), INVALID_ARGUMENT, RESOURCE_EXHAUSTED (no DRAM room, or the
 * batch does not fit the connection's staging area, which is told in the
 * handshake). */
KVPOOL_API kvpool_status kvpool_reserve(kvpool_client* client, const kvpool_key_id* ids,
                                        const uint64_t* sizes, size_t n, kvpool_region* regions,
                                        kvpool_status* statuses);
/* kvpool_reserve with descs[i] the descriptor of ids[i] (descs may be
 * NULL), kept for the commit. */
KVPOOL_API kvpool_status kvpool_reserve_described(kvpool_client* client, const kvpool_key_id* ids,
                                                  const uint64_t* sizes,
                                                  const kvpool_descriptor* descs, size_t n,
                                                  kvpool_region* regions, kvpool_status* statuses);
/* Publishes reserved slots. statuses[i]: OK, ALREADY_EXISTS (another writer
 * committed first; this slot is freed), INVALID_ARGUMENT (unknown handle). */
KVPOOL_API kvpool_status kvpool_commit(kvpool_client* client, const uint64_t* handles, size_t n,
                                       kvpool_status* statuses);
/* Frees reserved slots without publishing them. Unknown handles are ignored. */
KVPOOL_API kvpool_status kvpool_abort(kvpool_client* client, const uint64_t* handles, size_t n);
/* Pins n entries for reading in place (regions[i].data, read-only).
 * statuses[i]: OK or NOT_FOUND. A pinned entry stays intact until released. */
KVPOOL_API kvpool_status kvpool_acquire(kvpool_client* client, const kvpool_key_id* ids, size_t n,
                                        kvpool_region* regions, kvpool_status* statuses);
/* Unpins entries from kvpool_acquire. Unknown handles are ignored. */
KVPOOL_API kvpool_status kvpool_release(kvpool_client* client, const uint64_t* handles, size_t n);

/* ---- Introspection. ----------------------------------------------------- */
/* Copies the node's statistics as a NUL-terminated JSON object into buf (at
 * most cap bytes). *len gets the full length; RESOURCE_EXHAUSTED when cap is
 * too small. */
KVPOOL_API kvpool_status kvpool_stats_json(kvpool_client* client, char* buf, size_t cap,
                                           size_t* len);
/* Durability barrier: the node writes its SSD tier's partly filled regions
 * and waits for them, so everything demoted to SSD so far survives a crash
 * of the node. Values only in DRAM are not written. OK without an SSD tier. */
KVPOOL_API kvpool_status kvpool_flush(kvpool_client* client);
/* Drops every key of namespace `ns` (of this client's tenant) from the node,
 * both tiers: when it returns, every key of the namespace put before the call
 * is a miss, other namespaces are untouched, and the space is free. A put of
 * the namespace while it runs may stay or go. *dropped (when non-NULL) = the
 * entries dropped. The node blocks other local requests while it walks its
 * index (and lists its SSD tier's records), so this is for resets, not the
 * data path. Local mode only, and FAILED_PRECONDITION on a node whose store
 * is pooled with a cluster (a clear of one node would leave the namespace
 * served by the others); a tenant's store, never pooled, can be cleared. Two
 * namespaces share a tag (common/key_id.h) with probability 2^-32; clearing
 * one then clears both. */
KVPOOL_API kvpool_status kvpool_clear_namespace(kvpool_client* client, const void* ns,
                                                size_t ns_len, uint64_t* dropped);
/* A router's prefix lookup (docs/kv-events.md, "Prefix lookups"): which
 * nodes of the cluster hold the longest leading run of the engine block
 * hashes hashes[0..n) (in request order; as the engine's events name its
 * blocks, 64-bit ints), how long it is and in which tier, as a
 * NUL-terminated JSON object in buf (at most cap bytes; *len gets its
 * length, and RESOURCE_EXHAUSTED when cap is too small):
 *   {"blocks": n, "longest": k, "holders": [{"node", "address", "blocks",
 *    "dram", "ssd", "tiers": "DDS"}], "homes": h, "homes_failed": f}
 * Only blocks put with descriptors (kvpool_put_described) are known. The
 * node waits for the cluster up to timeout_ms (0: the node's
 * --lookup-timeout), within this client's own timeout. Local mode only;
 * INVALID_ARGUMENT beyond the node's --lookup-max-hashes; UNAVAILABLE
 * while the node is out of the cluster (fenced); FAILED_PRECONDITION for a
 * tenant's client (the index covers the default tenant). */
KVPOOL_API kvpool_status kvpool_lookup_prefix(kvpool_client* client, const uint64_t* hashes,
                                              size_t n, uint32_t timeout_ms, char* buf, size_t cap,
                                              size_t* len);
/* ---- Cache hints (docs/hints.md). ---------------------------------------- */
/* Advisory: they change what the node keeps in DRAM and when, never the
 * bytes a read returns. They apply to this client's tenant's keys on the
 * local node. */
typedef enum {
  KVPOOL_HINT_RETAIN = 1,   /* last in DRAM's eviction order for ttl_ms (priority 0..255) */
  KVPOOL_HINT_PIN = 2,      /* not evicted for ttl_ms, within the tenant's pin budget */
  KVPOOL_HINT_PREFETCH = 3, /* SSD -> DRAM now; returns once they are in DRAM */
  KVPOOL_HINT_DEMOTE = 4,   /* DRAM -> SSD now (no SSD tier: first in line to go) */
  KVPOOL_HINT_RELEASE = 5   /* ends retentions, pins and demotions now */
} kvpool_hint_op;
typedef struct {
  uint64_t applied; /* keys in DRAM it applied to (prefetch: in DRAM when it returned) */
  uint64_t unknown; /* keys not in DRAM (prefetch: in neither tier): not an error */
  uint64_t clipped; /* retentions ended by the node's --retain-max-percent */
  uint64_t moved;   /* keys moved between tiers (demote: to SSD; prefetch: into DRAM) */
} kvpool_hint_result;
/* One hint on ids[0..n) (at most 8,192 keys), applied whole; *result (when
 * non-NULL) gets its counts. INVALID_ARGUMENT
 * for an unknown op, a ttl_ms of 0 (retain, pin) or past the node's
 * --hint-max-ttl, a priority over 255, or more than 8,192 keys;
 * RESOURCE_EXHAUSTED for pins past the tenant's pin budget. On an
 * error nothing changes for the keys it names. Local mode only. */
KVPOOL_API kvpool_status kvpool_hint(kvpool_client* client, kvpool_hint_op op,
                                     const kvpool_key_id* ids, size_t n, uint64_t ttl_ms,
                                     uint32_t priority, kvpool_hint_result* result);

/* Largest value the node accepts, in bytes (0 when not connected; remote
 * mode: the peer transport's limit, 64 MiB). */
KVPOOL_API uint64_t kvpool_max_value_size(kvpool_client* client);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVPOOL_KVPOOL_H_ */
