// RemoteClient: libkvpool's remote mode, for a host without a node.
//
// It speaks the peer protocol (peer/peer_messages_format.h) over its own
// UcxTransport: it asks any of the configured nodes for the membership
// (kPeerMembers), computes the ShardMap exactly as the nodes do, and routes
// each key to its home: put is a Store at the home; get is a Lookup at the
// home and a Fetch from a holder straight into the caller's buffer (the
// transport sink); exists is a batched Lookup per home. The membership is
// refreshed in the background every refresh_interval, and at once (waiting
// for it) when a node does not answer; the failed items are then retried
// once on the new view.
//
// Thread-safe. Every call finishes by its deadline (options.timeout).
// Ownership: caller buffers are used only during a call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/key_id.h"
#include "common/status.h"

namespace kvpool::client {

struct RemoteClientOptions {
  // Peer addresses ("host:port") of any cluster nodes; one live one suffices.
  std::vector<std::string> seeds;
  // Deadline of each call: longer rides out slow peers, shorter fails sooner.
  std::chrono::milliseconds timeout{5000};
  // Background membership refresh: shorter notices joins sooner, costs a
  // small request per interval.
  std::chrono::milliseconds refresh_interval{2000};
  // A client token file (transport/peer_auth.h, LoadClientTokenFile; its
  // first entry is used); empty: none.
  std::string token_file;

  Status Validate() const;
};

// Parses "host:port[,host:port]" (spaces around entries are ignored).
Result<std::vector<std::string>> ParsePeerList(std::string_view list);

class RemoteClient {
 public:
  // The largest value a put accepts (the peer transport's payload limit).
  static constexpr uint64_t kMaxValueBytes = 64ull << 20;

  // Starts the transport and learns the membership; Unavailable when no
  // seed answers within options.timeout.
  static Result<std::unique_ptr<RemoteClient>> Open(const RemoteClientOptions& options);
  ~RemoteClient();
  RemoteClient(const RemoteClient&) = delete;
  RemoteClient& operator=(const RemoteClient&) = delete;

  // Per-item results are StatusCode values. Put: OK (stored at the home, or
  // it held the key already), InvalidArgument, ResourceExhausted,
  // Unavailable (the home did not answer), DeadlineExceeded. The call's
  // Status fails only when no item reached any node.
  Status Put(std::span<const KeyId> keys, const void* const* values, const uint64_t* sizes,
             int32_t* statuses);
  // Get into buffers[i] (capacities[i] bytes); sizes[i] the value's size.
  // Items: OK, NotFound, ResourceExhausted (buffer too small; sizes[i] says
  // how much is needed). Fails when no home answered.
  Status Get(std::span<const KeyId> keys, void* const* buffers, const uint64_t* capacities,
             uint64_t* sizes, int32_t* statuses);
  // hits[i] = 1 when the key's home knows a holder. Fails when no home answered.
  Status Exists(std::span<const KeyId> keys, uint8_t* hits);

  struct Impl;

 private:
  explicit RemoteClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::client
