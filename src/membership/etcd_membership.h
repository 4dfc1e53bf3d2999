// EtcdMembership: cluster membership kept in etcd.
//
// Open() registers this node under /kvpool/v1/<cluster>/members/<node-id>
// with a lease, in one txn that also takes a new incarnation from the
// counter /kvpool/v1/<cluster>/incarnation. A node id that is already
// registered is waited for while its lease may still expire by itself (a
// restart inside the old lease's TTL), then refused (FailedPrecondition). Run() is the membership
// loop, on a thread the node owns: it renews the lease every TTL/3, watches the members prefix and
// publishes a view whenever the member set changes (epoch = the etcd revision the view reflects).
//
// Fencing: if the lease has not been renewed for TTL/2 (or etcd says it is
// gone), the node asks its peers (probe_peers) how their own leases fare.
// If any of them renewed after this node's renewals began to fail, etcd is
// up and this node is cut from it: it is fenced: fenced() turns true and
// fence subscribers are told, so it stops serving remote work well before
// peers can drop it (TTL). The same when no peer answers (nobody to vouch
// for the old view) or there is no probe. If the peers that answer cannot
// renew either, etcd is down for everyone: the node keeps serving with its
// last view (etcd_outage() is true) and asks again every 250 ms until a
// renewal succeeds or a peer proves etcd is back (a peer renewing again
// may only have reached etcd first: the node renews once itself before it
// fences). While fenced the loop keeps trying to come back: it revokes the old
// lease (which removes the old registration) and registers again with a NEW
// incarnation, so no peer ever takes a request meant for the incarnation it
// may already have given up on. Then the flag clears.
//
// Restart inside the old lease (OldLeaseWait): Open() either waits for the
// previous registration's lease, or (kInRun, the node's choice) returns at
// once with the node joining -- fenced, so it does no remote work while its
// local clients are served -- and the loop registers once the old lease is
// gone.
//
// Proofs (prove/verify): with a cluster key, each registration carries
// HMACs of its record under the keys its node holds, and registrations
// without a valid one are left out of the view, so a node without the key
// never becomes a shard's home even where etcd lets it register.
//
// etcd unreachable: the last view stays as it is (nobody is dropped for
// etcd's sake). When etcd returns, leases that expired meanwhile take their
// keys with them and the owners re-register as above, so a member can leave
// and rejoin the view once.
//
// Thread-safety: Run() on one thread; Stop() and the Membership methods
// from any thread. Run() must have returned before destruction.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "membership/etcd_client.h"
#include "membership/membership.h"

namespace kvpool {

// What a peer says of its own lease (peer message kPeerLeaseStatus).
struct PeerLeaseReport {
  bool answered = false;
  bool fenced = false;     // the peer has fenced itself
  bool has_lease = false;  // false: the peer has no etcd lease (static membership)
  // When the peer last renewed its lease, on this node's steady clock.
  std::chrono::steady_clock::time_point renewed_at;
};

// Asks every other member of the current view, answering by `deadline`.
using PeerLeaseProbe = std::function<std::vector<PeerLeaseReport>(
    std::chrono::steady_clock::time_point deadline)>;

enum class LeaseVerdict {
  kFence,       // this node is cut from etcd (or cannot tell): fence
  kEtcdOutage,  // etcd is down for the peers too: keep the last view
};

// The fencing rule, given the peers' reports and when this node's renewals
// began to fail. `why` gets a sentence for the log.
// What a registration's proofs are made over: cluster, node id,
// incarnation, address and weight, one per line.
std::string MemberRecord(const std::string& cluster, const Member& m);

LeaseVerdict JudgeLease(std::span<const PeerLeaseReport> reports,
                        std::chrono::steady_clock::time_point failing_since, std::string* why);

struct EtcdMembershipOptions {
  // "http://host:port" or "https://host:port" of each etcd member.
  std::vector<std::string> endpoints;
  // etcd user auth and TLS (etcd_client.h); empty: none.
  EtcdSecurityOptions security;
  // Separates clusters sharing one etcd.
  std::string cluster = "default";
  std::string node_id;
  // Where peers reach this node, "host:port".
  std::string address;
  // Relative share of shards this node takes (0: none).
  double weight = 1.0;
  // Lease TTL (whole seconds, >= 2 s: etcd's minimum). Shorter: a dead node
  // leaves the view sooner, but an etcd hiccup fences nodes sooner.
  std::chrono::milliseconds lease_ttl{10000};
  // Bound on each etcd request (connect, write, each read). At most TTL/4,
  // so a hung etcd cannot delay the fence decision much.
  std::chrono::milliseconds request_timeout{1000};
  // Pause between attempts to register again while fenced.
  std::chrono::milliseconds retry_interval{500};
  // How long Open() keeps trying while etcd answers too slowly (a refused
  // connection fails at once).
  std::chrono::milliseconds open_timeout{10000};
  // A node id still registered under another lease (this node restarted
  // inside its previous life's TTL) is waited for: Open() waits until that
  // lease expires, at most its remaining TTL (as first seen) plus this
  // margin, then registers. A lease still renewed after that belongs to a
  // live process and Open() fails with FailedPrecondition. Longer tolerates
  // a slow etcd expiry; shorter refuses a duplicate id sooner.
  std::chrono::milliseconds live_id_margin{2000};
  // Asked before fencing (see the top of this file); empty: fence at once.
  // Called on the membership loop's thread.
  PeerLeaseProbe probe_peers;
  // Where a restart inside the previous registration's lease waits for it.
  // kInOpen: Open() waits (see live_id_margin). kInRun: Open() returns at
  // once with the node joining (joining() and fenced() true: no remote
  // work), and Run() registers as soon as the old lease is gone; if the id
  // is still live after the same bound, on_refused is called once with
  // FailedPrecondition and the node stays out of the cluster. The node uses
  // kInRun so that its local clients are served from its first second.
  enum class OldLeaseWait { kInOpen, kInRun };
  OldLeaseWait old_lease_wait = OldLeaseWait::kInOpen;
  std::function<void(const Status&)> on_refused;  // on the loop's thread
  // Proof of holding the cluster key. `prove` gives the proofs stored with
  // this node's registration for its record (MemberRecord); `verify` says
  // whether another registration's proofs are good for its record. A
  // registration that fails `verify` is left out of every view (it takes
  // no shard home) and counted (kvpool_membership_unproven_members). Both
  // empty: no proofs are written or asked for (a cluster without keys).
  std::function<std::vector<std::string>(const std::string& record)> prove;
  std::function<bool(const std::string& record, const std::vector<std::string>& proofs)> verify;

  Status Validate() const;
};

class EtcdMembership final : public Membership {
 public:
  // How Run() ends after Stop().
  enum class LeaveMode {
    kRevokeLease,   // graceful: the member disappears from every view at once
    kAbandonLease,  // leave the lease to expire, as a crash would
  };

  // Registers and reads the current members; waits (live_id_margin) for
  // the lease of a previous registration of this node id to expire.
  // FailedPrecondition when the id stays live; Unavailable when etcd
  // cannot be reached.
  // metrics may be null; otherwise it must outlive the membership.
  static Result<std::unique_ptr<EtcdMembership>> Open(const EtcdMembershipOptions& options,
                                                      MetricsRegistry* metrics);
  ~EtcdMembership() override;

  // The membership loop; returns after Stop(), having left as asked.
  void Run();
  // Asks Run() to return soon (within about one request_timeout).
  void Stop(LeaveMode mode = LeaveMode::kRevokeLease);

  // This node's lease as it answers kPeerLeaseStatus. Any thread.
  struct LeaseState {
    bool fenced = false;
    bool etcd_outage = false;
    std::chrono::milliseconds since_renewal{0};  // since the last renewal was sent
  };
  LeaseState lease_state() const;
  // True while etcd is unreachable for this node and its peers alike and
  // the node serves with its last view.
  bool etcd_outage() const;
  // True from an Open() under OldLeaseWait::kInRun that found the id still
  // registered until Run() registers (or the id is refused).
  bool joining() const;
  // Why the node is not (yet) a member, for readiness views; empty when it is.
  std::string joining_reason() const;

 private:
  struct Impl;
  EtcdMembership(const EtcdMembershipOptions& options, MetricsRegistry* metrics);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
