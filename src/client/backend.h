// ClientBackend: what the C ABI (client.cc, include/kvpool/kvpool.h) runs
// on. client.cc checks the arguments, turns the results into the ABI's
// status and last-error text, and calls one backend, chosen at open:
// the local one (local_backend.h: the node's Unix socket and shared
// segment) or the remote one (remote_backend.h: the peer protocol, no node
// on this host).
//
// Per-item results are StatusCode values in `statuses`; a call's Status
// says why the call as a whole failed (the ABI returns its code and keeps
// its text). The operations only a local node offers (zero-copy regions,
// remove, stats, flush) are a separate interface, LocalNodeOps; node_ops()
// is null where the backend has none.
//
// Thread-safe: calls may come from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/key_id.h"
#include "common/status.h"
#include "kvpool/kvpool.h"

namespace kvpool::client {

// Zero-copy regions of the node's segment, and the node's own calls.
class LocalNodeOps {
 public:
  virtual ~LocalNodeOps() = default;
  // statuses filled per item; a failed call may fill them with its code.
  // descs (may be null): a block descriptor per key (size 0: none).
  virtual Status Reserve(std::span<const KeyId> keys, const uint64_t* sizes,
                         const kvpool_descriptor* descs, kvpool_region* regions,
                         kvpool_status* statuses) = 0;
  virtual Status Commit(std::span<const uint64_t> handles, kvpool_status* statuses) = 0;
  virtual Status Abort(std::span<const uint64_t> handles) = 0;
  virtual Status Acquire(std::span<const KeyId> keys, kvpool_region* regions,
                         kvpool_status* statuses) = 0;
  virtual Status Release(std::span<const uint64_t> handles) = 0;
  virtual Status Remove(std::span<const KeyId> keys, kvpool_status* statuses) = 0;
  virtual Result<std::string> StatsJson() = 0;
  virtual Status Flush() = 0;
  // Drops every entry of the namespace with this tag; returns how many.
  virtual Result<uint64_t> ClearNamespace(uint32_t tag) = 0;
  // A router's prefix lookup through the node: its JSON answer.
  virtual Result<std::string> LookupPrefix(std::span<const uint64_t> hashes,
                                           uint32_t timeout_ms) = 0;
  // A cache hint on the keys (kvpool_hint), sent whole (at most
  // protocol::kMaxHintKeys keys).
  virtual Status Hint(uint32_t op, std::span<const KeyId> keys, uint64_t ttl_ms, uint32_t priority,
                      kvpool_hint_result* result) = 0;
};

class ClientBackend {
 public:
  virtual ~ClientBackend() = default;

  // Copies values in. Per item: OK, AlreadyExists, InvalidArgument,
  // ResourceExhausted, Unavailable, ... descs (may be null): a block
  // descriptor per key (size 0: none); a remote backend drops them.
  virtual Status Put(std::span<const KeyId> keys, const void* const* values, const uint64_t* sizes,
                     const kvpool_descriptor* descs, kvpool_status* statuses) = 0;
  // Copies values out into buffers[i] (capacities[i] bytes); sizes[i] the
  // value's size (also when it did not fit: ResourceExhausted).
  virtual Status Get(std::span<const KeyId> keys, void* const* buffers,
                     const uint64_t* capacities, uint64_t* sizes, kvpool_status* statuses) = 0;
  // hits (may be null): 1 per key present; prefix_len (may be null): how
  // many leading keys are present.
  virtual Status Exists(std::span<const KeyId> keys, uint8_t* hits, size_t* prefix_len) = 0;
  virtual uint64_t MaxValueBytes() = 0;

  // The local node's own operations; null when there is no local node.
  virtual LocalNodeOps* node_ops() = 0;
};

// Opens the backend options ask for (remote_peers set: remote). The
// options' strings are not kept.
Result<std::unique_ptr<ClientBackend>> OpenLocalBackend(const kvpool_options& options);
Result<std::unique_ptr<ClientBackend>> OpenRemoteBackend(const kvpool_options& options);

}  // namespace kvpool::client
