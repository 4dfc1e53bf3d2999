// The holdings stream: what a node's store holds, told as events as it
// changes. TieredStore emits every event from one function (its Emit) to one
// HoldingsObserver; the cluster publishes from it (cluster/holdings_announcer.h)
// and the block descriptors (blocks/descriptor_table.h) pass it on to KV
// events for routers and the block index.
//
// Events, per tier an entry enters or leaves:
//   kStored  kWritten   a writer committed it to DRAM (origin: who wrote it)
//   kStored  kPromoted  read from SSD into DRAM (the node held it already)
//   kDropped kMovedToSsd  evicted from DRAM, held on SSD (written back now or
//                       earlier)
//   kDropped kEvicted   evicted from DRAM and not kept on SSD, or reclaimed
//                       with its SSD region
//   kDropped kRemoved   removed by a caller (one event per tier it was in)
//   kDropped kHandedOff removed because another node took it over (placement)
//   kDropped kLost      the SSD tier found it unreadable (checksum, I/O)
// `still_held` on a kDropped event says the node still holds the key in the
// other tier; a key enters the node with a kWritten event and leaves it with
// the first kDropped event whose still_held is false.
//
// What the store holds when it opens (an SSD tier's recovered entries) is
// not streamed: list it (TieredStore::ListHeld).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/key_id.h"

namespace kvpool {

enum class HoldingTier : uint8_t { kDram = 0, kSsd = 1 };

// Who committed a written entry (as the writer told TieredStore::Commit).
enum class WriteOrigin : uint8_t {
  kPut = 0,     // a client of this node
  kCopy = 1,    // a copy of a value another node holds (a remote read)
  kPlaced = 2,  // handed to this node by its writer (this node is the home)
};

struct HoldingsEvent {
  enum class Kind : uint8_t { kStored, kDropped };
  enum class Why : uint8_t { kWritten, kPromoted, kMovedToSsd, kEvicted, kRemoved, kHandedOff, kLost };

  Kind kind = Kind::kStored;
  Why why = Why::kWritten;
  HoldingTier tier = HoldingTier::kDram;
  WriteOrigin origin = WriteOrigin::kPut;  // kWritten only
  bool still_held = false;                 // kDropped only: held in the other tier
  KeyId key;
  uint64_t size = 0;  // value bytes

  // The node held nothing of the key before this event / holds nothing after.
  bool enters_node() const { return kind == Kind::kStored && why == Why::kWritten; }
  bool leaves_node() const { return kind == Kind::kDropped && !still_held; }
};

const char* HoldingsWhyName(HoldingsEvent::Why why);

// The consumers of a store's stream, each in its own slot: the cluster's
// announcer, and the block descriptors (blocks/descriptor_table.h), which
// pass the stream on to KV events and the block index.
enum class HoldingsSlot : uint8_t { kCluster = 0, kBlocks = 1 };
inline constexpr size_t kHoldingsSlots = 2;

// Told of every event, on the thread that caused it (a writer, an eviction
// under the DRAM tier's lock, an SSD flush or promotion thread): quick, and
// never calls back into the store. A kWritten or kPromoted event is told
// just after the commit, outside the tier's lock: when an eviction of the
// same key races it, the kDropped may be told first (a consumer that must be
// exact re-checks TieredStore::Contains). Every other pair of one key's
// events arrives in the order the store applied them.
class HoldingsObserver {
 public:
  virtual ~HoldingsObserver() = default;
  virtual void OnHoldings(const HoldingsEvent& event) = 0;
};

}  // namespace kvpool
