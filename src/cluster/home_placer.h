// HomePlacer: placement "home". A value committed on this node whose key's
// home is another node is handed to that home (kPeerStore, the value sent
// from the pinned local entry without a copy); once the home has it, the
// local copy is removed (TieredStore::Remove, told to the holdings stream as
// kHandedOff), so capacity spreads over the homes. If the home cannot take
// it (dead, full, slow past the deadline), the value stays here and the
// caller is told to announce it (the `kept` callback), as a local placement
// would be.
//
// Hand-offs pin their values until the home answers, and pinned values
// cannot be evicted: a writer faster than the wire (or a hung home) would
// fill its DRAM with them and refuse puts. So the bytes in flight are
// bounded (max_inflight_bytes). A value put while the budget is spent is
// announced here at once (readable from anywhere) and queued, unpinned; the
// queue is handed off, oldest first, as hand-offs finish. A value evicted
// while it waits is simply gone. When the queue is full (max_queued), the
// value stays here for good.
//
// Placement "chain" (by_chain) uses the same hand-off with another target,
// chosen when a writer's hit-prefix call has named the value's chain
// (NoteChain): blocks that continue a chain go to the node holding the
// block before them, so a chain lives on one node and that node's eviction
// policy sees all of it (a chain's tail goes before its head); a new chain
// goes to the member this node has sent the fewest blocks to lately, which
// spreads what every writer places evenly over the members without any
// exchange of load; so does a continuation whose node has been fed over
// 1.25 times its share (many chains growing from one shared prefix). A
// value without a chain note stays here.
//
// The placer publishes nothing itself: Place's answer and the kept
// callback tell the holdings announcer (holdings_announcer.h) what to
// announce.
//
// Thread-safe; Place() is quick (a pin and an async call, or a queue
// push). Callbacks run on transport threads and use the store and the kept
// callback: destroy the placer after the cluster's transport.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "cluster/cluster.h"
#include <functional>

#include "common/metrics.h"
#include "store/tiered_store.h"

namespace kvpool::cluster {

struct HomePlacerOptions {
  // Deadline of one hand-off.
  std::chrono::milliseconds timeout{1000};
  // Value bytes in flight to homes at once (at least one value always may).
  uint64_t max_inflight_bytes = 64ull << 20;
  // Values waiting for the budget (16 + 8 bytes each).
  size_t max_queued = 65536;
  // Placement "chain": target the node NoteChain picked for the value (the
  // one holding the block before it, or the least fed for a new chain), not
  // the key's own home.
  bool by_chain = false;
  // Chain notes kept for values not yet committed (32 bytes each; all are
  // dropped when full).
  size_t max_chain_notes = 65536;
  // The tenant whose values these are (empty: the default tenant); its
  // hand-offs go as kPeerTenantStore.
  std::string tenant;
};

class HomePlacer {
 public:
  // A hand-off failed: the value stays here. `announced`: Place had
  // answered kQueued for it (announced already).
  using KeptFn = std::function<void(const KeyId& key, uint64_t size, bool announced)>;

  // All pointers must outlive the placer.
  HomePlacer(const HomePlacerOptions& options, Cluster* cluster, TieredStore* store, KeptFn kept,
             MetricsRegistry* metrics);
  ~HomePlacer();

  enum class Placement {
    kHere,        // stays here (its home is this node, or no room to queue it): announce it
    kHandingOff,  // being handed to its home: announce nothing unless `kept` says so
    kQueued,      // announce it now; it is handed off later (then removed as kHandedOff)
  };
  // The key was just committed here with `size` bytes.
  Placement Place(const KeyId& key, uint64_t size);
  // by_chain: keys about to be written here continue, in order, a chain
  // right after `before` (null: they start one), which is held at
  // `before_at` (a peer address, "" for here; nullopt: not known). Picks
  // their node; each is stored there just colder than the one before it.
  // returning[i]: keys[i] left the cache lately (may be empty: none did).
  void NoteChain(std::span<const KeyId> keys, const KeyId* before,
                 const std::optional<std::string>& before_at, const std::vector<bool>& returning);
  // by_chain: sends a noted key's value to its target from a copy of
  // `value`, without storing it here first (a commit-then-move would take a
  // slot here, evicting something, only to free it again). True when sent;
  // false (no note, the target is this node, the budget is spent): commit
  // it here and Place it. A value the target refuses is stored here.
  bool Forward(const KeyId& key, std::span<const uint8_t> value);
  // Whether key has a note whose target is another node.
  bool WouldForward(const KeyId& key);
  // Starts no more hand-offs: values placed from now on stay here (kHere),
  // queued ones stay where they are, and failed hand-offs start no others.
  // Call before the cluster's transport stops: stopping it fails the
  // hand-offs in flight, and each failure would otherwise start the next.
  void Stop() { stopped_.store(true); }

 private:
  // Where a value goes: placement home: the home of `route`; chain: the
  // member at `address` ("" here). Stored there after `after`.
  struct Target {
    KeyId route;
    std::string address;
    std::optional<KeyId> after;
    bool returning = false;  // the key left the cache lately
  };
  struct Queued {
    KeyId key;
    uint64_t size = 0;
    Target target;
  };
  enum class Start { kStarted, kHere, kBusy };
  // Starts the hand-off of key unless the budget is spent (kBusy). Keys
  // whose home is (now) this node stay here (kHere). `announced`: Place
  // answered kQueued.
  Start TryStart(const KeyId& key, const Target& target, uint64_t size, bool announced);
  // Takes size bytes from the in-flight budget; false when it is spent.
  bool TakeBudget(uint64_t size);
  // kPeerStore of value to address; value must live until done runs.
  void Send(const std::string& address, const KeyId& key, const Target& target,
            std::span<const uint8_t> value, transport::ReplyCallback done);
  // The peer address a target goes to now; "" when it stays here.
  std::string AddressOf(const Target& target) const;
  // by_chain: the address a noted key goes to, "" when this node; *target
  // is its note.
  std::string ForwardTarget(const KeyId& key, Target* target);
  // by_chain: the member a new chain goes to (the least fed lately), as an
  // address ("" here), counting n blocks to it. REQUIRES: mu_ held.
  std::string PickForNewChain(size_t n);
  // Starts queued hand-offs while the budget allows.
  void Drain();

  Cluster* const cluster_;
  const KeptFn kept_fn_;
  TieredStore* const store_;
  const HomePlacerOptions opts_;
  static constexpr uint64_t kFedHalfLife = 1u << 20;  // blocks
  static constexpr uint64_t kFedSlack = 256;          // blocks over the share always allowed
  std::atomic<uint64_t> inflight_bytes_{0};
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::deque<Queued> queue_;  // protected by mu_
  std::unordered_map<KeyId, Target, KeyIdHash> chain_notes_;  // by_chain; protected by mu_
  // by_chain: blocks this node placed per member (node id) lately, halved
  // as they grow; protected by mu_.
  std::unordered_map<std::string, uint64_t> fed_;
  uint64_t fed_total_ = 0;
  MetricsRegistry* const metrics_;
  Counter* moved_;
  Counter* kept_;
  Counter* busy_;
  Counter* queue_full_;
  Counter* notes_dropped_;
  Counter* forwarded_;
  Counter* overfed_;
  Counter* forward_dropped_;
};

}  // namespace kvpool::cluster
