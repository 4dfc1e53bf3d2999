#include "cluster/cluster_placement.h"

#include <optional>
#include <string>
#include <vector>

namespace kvpool::cluster {

ClusterPlacement::ClusterPlacement(Placement placement, HoldingsAnnouncer* announcer,
                                   const RemoteReader* reader)
    : announcer_(announcer),
      chain_placer_(placement == Placement::kChain ? announcer->placer() : nullptr),
      reader_(reader),
      publish_now_(placement != Placement::kHome) {}

void ClusterPlacement::NoteChain(const KeyId* before, std::span<const KeyId> keys) {
  if (chain_placer_ == nullptr) return;
  // Where the chain's previous block is: the exists call before this put
  // asked for it, so its home's answer is at hand when it is not here.
  std::optional<std::string> at;
  if (before != nullptr) at = reader_->HolderOf(*before);
  std::vector<bool> returning;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!reader_->EvictedLately(keys[i])) continue;
    returning.resize(keys.size());
    returning[i] = true;
  }
  chain_placer_->NoteChain(keys, before, at, returning);
}

bool ClusterPlacement::Forward(const KeyId& key, std::span<const uint8_t> value) {
  return chain_placer_ != nullptr && chain_placer_->Forward(key, value);
}

bool ClusterPlacement::WouldForward(const KeyId& key) const {
  return chain_placer_ != nullptr && chain_placer_->WouldForward(key);
}

void ClusterPlacement::PublishNow() {
  if (publish_now_) announcer_->FlushNow();
}

}  // namespace kvpool::cluster
