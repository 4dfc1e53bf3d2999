// Cluster: this node's part in a kvpool cluster. Owns the peer transport
// (UCX), the membership (etcd or a static --peers list) and the current
// shard map, recomputed on every membership view; the directory and remote
// reads (cluster_peer.h) are built on top of it.
//
// Threading: Run() is the membership loop, on a thread the node owns; it
// returns after Stop(). Everything else may be called from any thread.
// Destruction requires Run() to have returned (or never started).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/executor.h"
#include "common/metrics.h"
#include "common/status.h"
#include "membership/etcd_client.h"
#include "membership/membership.h"
#include "membership/shard_map.h"
#include "transport/peer_auth.h"
#include "transport/transport.h"
#include "transport/ucx_transport.h"

namespace kvpool {

struct ClusterOptions {
  std::string node_id;
  // The peer transport: bind address (transport.listen_host, loopback by
  // default) and port (listen_port, 0: any free), the host peers reach it
  // at (advertise_host; empty: listen_host, or the host name when that is a
  // wildcard), progress_spin, net_devices, the DRAM segment
  // (registered_region), cluster keys, client tokens and peer_encryption
  // (transport/ucx_transport.h). The cluster fills in identity, the
  // handler executor, metrics and the client message types.
  transport::UcxTransportOptions transport;
  // etcd endpoints ("http://host:port" or "https://host:port"); empty:
  // static or standalone.
  std::vector<std::string> etcd;
  // etcd's own auth (membership/etcd_client.h), all optional: a user whose
  // password is the first line of a secret file (read when the options are
  // validated and when the cluster opens), and for https endpoints the CA
  // of etcd's certificate and a client certificate and key.
  EtcdSecurityFiles etcd_security;
  // Static member list "id=host:port[*weight],..." (used without etcd).
  std::string peers;
  std::string cluster = "default";
  // Lease TTL with etcd: shorter drops dead nodes sooner, fences sooner.
  std::chrono::milliseconds lease_ttl{10000};
  // Relative share of shards this node takes.
  double weight = 1.0;
  // With etcd and cluster keys: also count registrations that carry no
  // proof at all (nodes of a version before membership proofs), for a
  // rolling upgrade from such a version; a registration whose proofs are
  // wrong is left out still. Off: only proven registrations count.
  bool accept_unproven_members = false;

  // With etcd: called once, from the membership loop, when this node's id
  // stays registered by a live process after the restart wait
  // (EtcdMembershipOptions::OldLeaseWait::kInRun); the node then stays out
  // of the cluster. Empty: logged only.
  std::function<void(const Status&)> on_refused;

  bool enabled() const { return !etcd.empty() || !peers.empty(); }
  Status Validate() const;
};

class Cluster {
 public:
  // Opens the transport, then joins the membership (FailedPrecondition when
  // the node id is live already). `handler_executor` runs peer request
  // handlers; `metrics` must outlive the cluster. Both are not owned.
  static Result<std::unique_ptr<Cluster>> Open(const ClusterOptions& options,
                                               Executor* handler_executor,
                                               MetricsRegistry* metrics);
  // Assembles a cluster from parts already open (tests: an in-process
  // transport and a static membership). Run() then just waits for Stop().
  static std::unique_ptr<Cluster> Assemble(std::string node_id,
                                           std::unique_ptr<transport::Transport> transport,
                                           std::unique_ptr<Membership> membership);
  virtual ~Cluster() = default;

  // The membership loop; returns after Stop().
  virtual void Run() = 0;
  // Leaves the cluster (graceful: the member disappears at once) and makes
  // Run() return.
  virtual void Stop() = 0;

  virtual const std::string& node_id() const = 0;
  virtual uint64_t incarnation() const = 0;
  virtual bool fenced() const = 0;
  // True while etcd is down for this node and its peers alike and the node
  // serves with its last view instead of fencing (membership/etcd_membership.h).
  virtual bool etcd_outage() const = 0;
  // True while a restarted node waits for its previous registration's lease
  // before it joins (fenced() is true meanwhile: local work only);
  // joining_reason() says why, or that the id was refused.
  virtual bool joining() const = 0;
  virtual std::string joining_reason() const = 0;
  // "host:port" peers reach this node at.
  virtual std::string address() const = 0;
  virtual transport::Transport* transport() const = 0;
  virtual Membership* membership() const = 0;
  // A peer reports running as `incarnation` (peer messages carry it). With
  // static membership a newer one than the view lists is a restarted peer
  // (StaticMembership::ObservePeer); with etcd the view already says so.
  virtual void ObservePeer(const std::string& node_id, uint64_t incarnation) = 0;
  // Immutable snapshots; never null.
  virtual std::shared_ptr<const MembershipView> view() const = 0;
  virtual std::shared_ptr<const ShardMap> shard_map() const = 0;

  // One reply of AskOtherMembers: the member, its reply, when it came.
  struct MemberReply {
    Member member;
    transport::Reply reply;
    std::chrono::steady_clock::time_point received;
  };
  // Sends an empty request of `type` to every other member of the current
  // view at once; returns their replies (in view order) by the deadline,
  // which the transport holds every call to. Blocks: never call it from a
  // transport thread.
  virtual std::vector<MemberReply> AskOtherMembers(transport::MessageType type,
                                                   transport::Deadline deadline) = 0;
};

}  // namespace kvpool
