// EtcdMembership: cluster membership kept in etcd.
//
// Open() registers this node under /kvpool/v1/<cluster>/members/<node-id>
// with a lease, in one txn that also takes a new incarnation from the
// counter /kvpool/v1/<cluster>/incarnation; a node id that is already live
// is refused (FailedPrecondition). Run() is the membership loop, on a
// thread the node owns: it renews the lease every TTL/3, watches the
// members prefix and publishes a view whenever the member set changes
// (epoch = the etcd revision the view reflects).
//
// Fencing: if the lease has not been renewed for TTL/2 (or etcd says it is
// gone), the node is fenced: fenced() turns true and fence subscribers are
// told, so it stops serving remote work well before peers can drop it
// (TTL). While fenced the loop keeps trying to come back: it revokes the old
// lease (which removes the old registration) and registers again with a NEW
// incarnation, so no peer ever takes a request meant for the incarnation it
// may already have given up on. Then the flag clears.
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
#include <memory>
#include <string>
#include <vector>

#include "cluster/membership.h"
#include "common/status.h"

namespace kvpool {

struct EtcdMembershipOptions {
  // "http://host:port" of each etcd member.
  std::vector<std::string> endpoints;
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

  Status Validate() const;
};

class EtcdMembership final : public Membership {
 public:
  // How Run() ends after Stop().
  enum class LeaveMode {
    kRevokeLease,   // graceful: the member disappears from every view at once
    kAbandonLease,  // leave the lease to expire, as a crash would
  };

  // Registers and reads the current members. FailedPrecondition when the
  // node id is live already; Unavailable when etcd cannot be reached.
  // metrics may be null; otherwise it must outlive the membership.
  static Result<std::unique_ptr<EtcdMembership>> Open(const EtcdMembershipOptions& options,
                                                      MetricsRegistry* metrics);
  ~EtcdMembership() override;

  // The membership loop; returns after Stop(), having left as asked.
  void Run();
  // Asks Run() to return soon (within about one request_timeout).
  void Stop(LeaveMode mode = LeaveMode::kRevokeLease);

 private:
  struct Impl;
  EtcdMembership(const EtcdMembershipOptions& options, MetricsRegistry* metrics);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
