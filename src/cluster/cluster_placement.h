// ClusterPlacement: the cluster's RemotePlacement for one tenant's writes.
// - PublishNow has the tenant's HoldingsAnnouncer send what it queued at
//   once (HoldingsAnnouncer::FlushNow). Under placement home it does
//   nothing: a put's values are findable once their homes store them (a
//   home publishes what is placed on it before it answers), and the
//   writer's interim copies are left to the announcer's schedule.
// - Under placement chain, NoteChain tells the announcer's HomePlacer
//   where the chain's previous block is (here, at a holder the reader's
//   lookups named, or not known) and which of the keys come back after an
//   eviction; Forward and WouldForward are the placer's. Under the other
//   placements they do nothing (false).
//
// Thread-safe. The announcer and the reader must outlive it.
#pragma once

#include <cstdint>
#include <span>

#include "cluster/holdings_announcer.h"
#include "cluster/remote_reader.h"
#include "cluster/remote_source.h"
#include "common/enum_names.h"

namespace kvpool::cluster {

// Where a put is stored: the writer's node, published to the key's home
// (kLocal); the key's home node (kHome); or the node holding the rest of
// its prefix chain, reads keeping no replicas (kChain).
enum class Placement { kLocal, kHome, kChain };
inline constexpr EnumNames<Placement, 3> kPlacementNames = {
    {{"local", Placement::kLocal}, {"home", Placement::kHome}, {"chain", Placement::kChain}}};

class ClusterPlacement final : public RemotePlacement {
 public:
  ClusterPlacement(Placement placement, HoldingsAnnouncer* announcer, const RemoteReader* reader);

  void NoteChain(const KeyId* before, std::span<const KeyId> keys) override;
  bool Forward(const KeyId& key, std::span<const uint8_t> value) override;
  bool WouldForward(const KeyId& key) const override;
  void PublishNow() override;

 private:
  HoldingsAnnouncer* const announcer_;
  HomePlacer* const chain_placer_;  // placement chain only, else null
  const RemoteReader* const reader_;
  const bool publish_now_;  // not under placement home
};

}  // namespace kvpool::cluster
