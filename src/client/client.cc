// The C ABI of libkvpool (include/kvpool/kvpool.h): checks the arguments,
// calls the client's backend (client/backend.h: the local node or remote
// mode) and turns its results into the ABI's status codes and last-error
// text.
#include <atomic>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include <fmt/format.h>

#include "client/backend.h"
#include "client/fork_guard.h"
#include "client/local_connection.h"
#include "common/key_id.h"
#include "kvpool/kvpool.h"

struct kvpool_client {
  std::unique_ptr<kvpool::client::ClientBackend> backend;
  // The fork generation (client/fork_guard.h) the backend belongs to: a
  // call in a forked child sees another and replaces the backend first.
  std::atomic<uint64_t> generation{0};
  // What kvpool_open was given, kept to open the same backend in a child.
  kvpool_options options{};
  std::string socket_path, remote_peers, remote_token_file, tenant_token_file, client_name;
};

namespace kvpool {
namespace {

thread_local std::string g_last_error;

kvpool_status Fail(const Status& s) {
  g_last_error = s.ToString();
  return static_cast<kvpool_status>(s.code());
}

kvpool_status Overall(const kvpool_status* statuses, size_t n, bool existing_ok) {
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i] == KVPOOL_OK) continue;
    if (existing_ok && statuses[i] == KVPOOL_ALREADY_EXISTS) continue;
    g_last_error = fmt::format("item {}: {}", i,
                               StatusCodeName(static_cast<StatusCode>(statuses[i])));
    return statuses[i];
  }
  return KVPOOL_OK;
}

std::span<const KeyId> AsKeys(const kvpool_key_id* ids, size_t n) {
  static_assert(sizeof(KeyId) == sizeof(kvpool_key_id) && offsetof(KeyId, lo) == offsetof(kvpool_key_id, lo));
  return {reinterpret_cast<const KeyId*>(ids), n};
}

const char* OrNull(const std::string& s) { return s.empty() ? nullptr : s.c_str(); }

// In a forked child: the parent's backend is left alone (its connections
// and mappings are closed in the child already, client/fork_guard.h) and
// leaked, and a backend of the child's own is opened, or the call fails
// as the options ask. REQUIRES: c's generation is not the current one.
Status FollowFork(kvpool_client* c) {
  std::lock_guard lock(client::ForkReopenMutex());
  const uint64_t now = client::ForkGeneration();
  if (c->generation.load(std::memory_order_acquire) == now) return Status::Ok();  // another thread did
  if (c->options.remote_peers != nullptr) {
    return FailedPrecondition(
        "this remote-mode client was opened before fork(): a child must open its own client");
  }
  if (c->options.after_fork == KVPOOL_AFTER_FORK_FAIL) {
    return FailedPrecondition(
        "this client was opened before fork() (KVPOOL_AFTER_FORK_FAIL): a child must open its own "
        "client");
  }
  auto backend = client::OpenLocalBackend(c->options);
  if (!backend.ok()) return backend.status();
  (void)c->backend.release();  // the parent's: never destroyed here
  c->backend = std::move(backend).value();
  c->generation.store(now, std::memory_order_release);
  return Status::Ok();
}

// The client's backend in this process, or null (with the error set).
client::ClientBackend* Backend(kvpool_client* c, kvpool_status* status) {
  if (c == nullptr) {
    *status = Fail(InvalidArgument("client is NULL"));
    return nullptr;
  }
  if (c->generation.load(std::memory_order_acquire) != client::ForkGeneration()) {
    if (Status s = FollowFork(c); !s.ok()) {
      *status = Fail(s);
      return nullptr;
    }
  }
  return c->backend.get();
}

// The local node's operations of a client, or null (with the error set)
// when its backend has none: remote mode has no shared segment, no
// node-side handles and no node of its own.
client::LocalNodeOps* NodeOps(kvpool_client* c, const char* call, kvpool_status* status) {
  client::ClientBackend* b = Backend(c, status);
  if (b == nullptr) return nullptr;
  client::LocalNodeOps* ops = b->node_ops();
  if (ops == nullptr) {
    *status = Fail(FailedPrecondition(fmt::format("{} is not available in remote mode", call)));
  }
  return ops;
}

}  // namespace
}  // namespace kvpool

using namespace kvpool;

extern "C" {

const char* kvpool_status_name(kvpool_status status) {
  if (status < 0 || status > KVPOOL_PERMISSION_DENIED) return "Unknown";
  return StatusCodeName(static_cast<StatusCode>(status)).data();
}

const char* kvpool_version(void) { return KVPOOL_VERSION; }

const char* kvpool_last_error(void) { return g_last_error.c_str(); }

void kvpool_options_init(kvpool_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->socket_path = nullptr;
  o->timeout_ms = 5000;
  o->max_connections = 8;
  o->reconnect = 1;
  o->copy_mode = 0;
  o->spin_us = 50;
  o->remote_peers = nullptr;
  o->remote_refresh_ms = 2000;
  o->expected_server_uid = LocalConnection::kSocketDirOwner;
  o->remote_token_file = nullptr;
  o->tenant_token_file = nullptr;
  o->client_name = nullptr;
  o->after_fork = KVPOOL_AFTER_FORK_RECONNECT;
}

kvpool_client* kvpool_open(const kvpool_options* options, kvpool_status* status) {
  kvpool_status dummy;
  if (status == nullptr) status = &dummy;
  g_last_error.clear();
  kvpool_options o;
  kvpool_options_init(&o);
  if (options != nullptr) {
    if (options->struct_size < offsetof(kvpool_options, timeout_ms) ||
        options->struct_size > sizeof(kvpool_options)) {
      *status = Fail(InvalidArgument("kvpool_options.struct_size is not set (use kvpool_options_init)"));
      return nullptr;
    }
    std::memcpy(&o, options, options->struct_size);
    o.struct_size = sizeof(o);
  }
  if (o.timeout_ms == 0 || o.max_connections == 0 || o.max_connections > 255) {
    *status = Fail(InvalidArgument("timeout_ms must be > 0 and max_connections in 1..255"));
    return nullptr;
  }
  auto backend = o.remote_peers != nullptr ? client::OpenRemoteBackend(o)
                                           : client::OpenLocalBackend(o);
  if (!backend.ok()) {
    *status = Fail(backend.status());
    return nullptr;
  }
  auto c = std::make_unique<kvpool_client>();
  c->generation.store(client::ForkGeneration());
  c->backend = std::move(backend).value();
  c->options = o;
  auto keep = [](const char* s, std::string* into) {
    if (s != nullptr) *into = s;
  };
  keep(o.socket_path, &c->socket_path);
  keep(o.remote_peers, &c->remote_peers);
  keep(o.remote_token_file, &c->remote_token_file);
  keep(o.tenant_token_file, &c->tenant_token_file);
  keep(o.client_name, &c->client_name);
  c->options.socket_path = OrNull(c->socket_path);
  c->options.remote_peers = o.remote_peers != nullptr ? c->remote_peers.c_str() : nullptr;
  c->options.remote_token_file = OrNull(c->remote_token_file);
  c->options.tenant_token_file = OrNull(c->tenant_token_file);
  c->options.client_name = OrNull(c->client_name);
  *status = KVPOOL_OK;
  return c.release();
}

void kvpool_close(kvpool_client* client) {
  if (client == nullptr) return;
  // In a forked child the backend may be the parent's: it is not ours to
  // close (its connections were closed in the child already).
  if (client->generation.load(std::memory_order_acquire) != client::ForkGeneration()) {
    (void)client->backend.release();
  }
  // Closing the connections makes the node release every pin and reservation.
  delete client;
}

void kvpool_key_ids(const void* ns, size_t ns_len, const void* const* keys, const size_t* key_lens,
                    size_t n, kvpool_key_id* out) {
  std::string_view nsv(static_cast<const char*>(ns), ns_len);
  for (size_t i = 0; i < n; ++i) {
    KeyId id = MakeKeyId(nsv, std::string_view(static_cast<const char*>(keys[i]), key_lens[i]));
    out[i] = {id.hi, id.lo};
  }
}

kvpool_status kvpool_reserve(kvpool_client* c, const kvpool_key_id* ids, const uint64_t* sizes,
                             size_t n, kvpool_region* regions, kvpool_status* statuses) {
  return kvpool_reserve_described(c, ids, sizes, nullptr, n, regions, statuses);
}

kvpool_status kvpool_reserve_described(kvpool_client* c, const kvpool_key_id* ids,
                                       const uint64_t* sizes, const kvpool_descriptor* descs,
                                       size_t n, kvpool_region* regions, kvpool_status* statuses) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_reserve", &st);
  if (ops == nullptr) return st;
  Status s = ops->Reserve(AsKeys(ids, n), sizes, descs, regions, statuses);
  if (!s.ok()) return Fail(s);
  return Overall(statuses, n, /*existing_ok=*/true);
}

kvpool_status kvpool_commit(kvpool_client* c, const uint64_t* handles, size_t n,
                            kvpool_status* statuses) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_commit", &st);
  if (ops == nullptr) return st;
  Status s = ops->Commit({handles, n}, statuses);
  if (!s.ok()) return Fail(s);
  return Overall(statuses, n, /*existing_ok=*/true);
}

kvpool_status kvpool_abort(kvpool_client* c, const uint64_t* handles, size_t n) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_abort", &st);
  if (ops == nullptr) return st;
  Status s = ops->Abort({handles, n});
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_acquire(kvpool_client* c, const kvpool_key_id* ids, size_t n,
                             kvpool_region* regions, kvpool_status* statuses) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_acquire", &st);
  if (ops == nullptr) return st;
  Status s = ops->Acquire(AsKeys(ids, n), regions, statuses);
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_release(kvpool_client* c, const uint64_t* handles, size_t n) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_release", &st);
  if (ops == nullptr) return st;
  Status s = ops->Release({handles, n});
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_put(kvpool_client* c, const kvpool_key_id* ids, const void* const* values,
                         const uint64_t* sizes, size_t n, kvpool_status* statuses) {
  return kvpool_put_described(c, ids, values, sizes, nullptr, n, statuses);
}

kvpool_status kvpool_put_described(kvpool_client* c, const kvpool_key_id* ids,
                                   const void* const* values, const uint64_t* sizes,
                                   const kvpool_descriptor* descs, size_t n,
                                   kvpool_status* statuses) {
  kvpool_status st;
  client::ClientBackend* b = Backend(c, &st);
  if (b == nullptr) return st;
  Status s = b->Put(AsKeys(ids, n), values, sizes, descs, statuses);
  if (!s.ok()) return Fail(s);
  return Overall(statuses, n, /*existing_ok=*/true);
}

kvpool_status kvpool_get(kvpool_client* c, const kvpool_key_id* ids, void* const* buffers,
                         const uint64_t* capacities, size_t n, uint64_t* sizes,
                         kvpool_status* statuses) {
  kvpool_status st;
  client::ClientBackend* b = Backend(c, &st);
  if (b == nullptr) return st;
  Status s = b->Get(AsKeys(ids, n), buffers, capacities, sizes, statuses);
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_exists(kvpool_client* c, const kvpool_key_id* ids, size_t n, uint8_t* hits,
                            size_t* prefix_len) {
  kvpool_status st;
  client::ClientBackend* b = Backend(c, &st);
  if (b == nullptr) return st;
  Status s = b->Exists(AsKeys(ids, n), hits, prefix_len);
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_remove(kvpool_client* c, const kvpool_key_id* ids, size_t n,
                            kvpool_status* statuses) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_remove", &st);
  if (ops == nullptr) return st;
  Status s = ops->Remove(AsKeys(ids, n), statuses);
  return s.ok() ? KVPOOL_OK : Fail(s);
}

// A JSON answer into the caller's buffer, NUL-terminated; *len its length.
static kvpool_status CopyJson(const Result<std::string>& json, const char* what, char* buf,
                              size_t cap, size_t* len) {
  if (!json.ok()) return Fail(json.status());
  if (len != nullptr) *len = json->size();
  if (buf == nullptr || cap < json->size() + 1) {
    return Fail(ResourceExhausted(fmt::format("{} need {} bytes", what, json->size() + 1)));
  }
  std::memcpy(buf, json->c_str(), json->size() + 1);
  return KVPOOL_OK;
}

kvpool_status kvpool_stats_json(kvpool_client* c, char* buf, size_t cap, size_t* len) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_stats_json", &st);
  if (ops == nullptr) return st;
  return CopyJson(ops->StatsJson(), "stats", buf, cap, len);
}

kvpool_status kvpool_lookup_prefix(kvpool_client* c, const uint64_t* hashes, size_t n,
                                   uint32_t timeout_ms, char* buf, size_t cap, size_t* len) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_lookup_prefix", &st);
  if (ops == nullptr) return st;
  if (n > 0 && hashes == nullptr) return Fail(InvalidArgument("hashes is NULL"));
  return CopyJson(ops->LookupPrefix({hashes, n}, timeout_ms), "the answer and its NUL", buf, cap,
                  len);
}

kvpool_status kvpool_hint(kvpool_client* c, kvpool_hint_op op, const kvpool_key_id* ids, size_t n,
                          uint64_t ttl_ms, uint32_t priority, kvpool_hint_result* result) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_hint", &st);
  if (ops == nullptr) return st;
  if (n > 0 && ids == nullptr) return Fail(InvalidArgument("kvpool_hint: ids is NULL"));
  if (op < KVPOOL_HINT_RETAIN || op > KVPOOL_HINT_RELEASE) {
    return Fail(InvalidArgument(fmt::format("kvpool_hint: unknown operation {}", int{op})));
  }
  if (priority > 255) return Fail(InvalidArgument("kvpool_hint: priority must be in 0..255"));
  kvpool_hint_result r{};
  Status s = ops->Hint(static_cast<uint32_t>(op), AsKeys(ids, n), ttl_ms, priority, &r);
  if (result != nullptr) *result = r;
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_flush(kvpool_client* c) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_flush", &st);
  if (ops == nullptr) return st;
  Status s = ops->Flush();
  return s.ok() ? KVPOOL_OK : Fail(s);
}

kvpool_status kvpool_clear_namespace(kvpool_client* c, const void* ns, size_t ns_len,
                                     uint64_t* dropped) {
  kvpool_status st;
  client::LocalNodeOps* ops = NodeOps(c, "kvpool_clear_namespace", &st);
  if (ops == nullptr) return st;
  if (ns == nullptr && ns_len > 0) {
    return Fail(InvalidArgument("kvpool_clear_namespace: ns is NULL with a length"));
  }
  std::string_view nsv(static_cast<const char*>(ns), ns == nullptr ? 0 : ns_len);
  auto n = ops->ClearNamespace(NamespaceTag(nsv));
  if (!n.ok()) return Fail(n.status());
  if (dropped != nullptr) *dropped = *n;
  return KVPOOL_OK;
}

uint64_t kvpool_max_value_size(kvpool_client* c) {
  kvpool_status st;
  client::ClientBackend* b = Backend(c, &st);
  return b == nullptr ? 0 : b->MaxValueBytes();
}

}  // extern "C"
