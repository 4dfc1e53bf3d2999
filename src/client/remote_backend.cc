// The remote backend of the C ABI: RemoteClient, for a host without a node
// (see backend.h). It has no shared segment, no node-side handles and no
// node of its own: no LocalNodeOps.
#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "client/backend.h"
#include "client/remote_client.h"

namespace kvpool::client {
namespace {

class RemoteBackend final : public ClientBackend {
 public:
  explicit RemoteBackend(std::unique_ptr<RemoteClient> remote) : remote_(std::move(remote)) {}

  // Descriptors are kept by the node a value is written through (its KV
  // events); a remote-mode put goes through none, so they are dropped.
  Status Put(std::span<const KeyId> keys, const void* const* values, const uint64_t* sizes,
             const kvpool_descriptor* /*descs*/, kvpool_status* statuses) override {
    return remote_->Put(keys, values, sizes, statuses);
  }
  Status Get(std::span<const KeyId> keys, void* const* buffers, const uint64_t* capacities,
             uint64_t* sizes, kvpool_status* statuses) override {
    return remote_->Get(keys, buffers, capacities, sizes, statuses);
  }
  Status Exists(std::span<const KeyId> keys, uint8_t* hits, size_t* prefix_len) override {
    std::vector<uint8_t> h(keys.size());
    KVPOOL_RETURN_IF_ERROR(remote_->Exists(keys, h.data()));
    if (hits != nullptr) std::copy(h.begin(), h.end(), hits);
    if (prefix_len != nullptr) {
      *prefix_len = static_cast<size_t>(std::find(h.begin(), h.end(), 0) - h.begin());
    }
    return Status::Ok();
  }
  uint64_t MaxValueBytes() override { return RemoteClient::kMaxValueBytes; }
  LocalNodeOps* node_ops() override { return nullptr; }

 private:
  std::unique_ptr<RemoteClient> remote_;
};

}  // namespace

Result<std::unique_ptr<ClientBackend>> OpenRemoteBackend(const kvpool_options& o) {
  KVPOOL_ASSIGN_OR_RETURN(auto seeds, ParsePeerList(o.remote_peers));
  RemoteClientOptions ro;
  ro.seeds = std::move(seeds);
  if (o.remote_token_file != nullptr) ro.token_file = o.remote_token_file;
  ro.timeout = std::chrono::milliseconds(o.timeout_ms);
  if (o.remote_refresh_ms > 0) ro.refresh_interval = std::chrono::milliseconds(o.remote_refresh_ms);
  KVPOOL_ASSIGN_OR_RETURN(auto remote, RemoteClient::Open(ro));
  return std::unique_ptr<ClientBackend>(std::make_unique<RemoteBackend>(std::move(remote)));
}

}  // namespace kvpool::client
