// StaticMembership: a fixed member list (the --peers setting), for clusters
// without etcd. The member set never changes and a static node is never
// fenced, but every start of a node is a new instance: its incarnation (the
// start time in microseconds) travels in its peer messages, and a peer that
// reports an incarnation newer than the view lists (ObservePeer) makes a new
// view with it. So a restarted peer is told from its previous life, as with
// etcd: homes drop the old instance's directory entries and holders replay
// to the new one. A peer not heard from yet is listed with incarnation 0
// (matches any). Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "membership/membership.h"

namespace kvpool {

struct StaticMembershipOptions {
  // This node; must appear in peers.
  std::string node_id;
  // This node's incarnation (e.g. from the start time); peers get 0.
  uint64_t incarnation = 0;
  // Every member, this node included.
  std::vector<Member> peers;

  Status Validate() const;
};

// Parses "id=host:port[*weight],id2=host:port,..." (weight defaults to 1).
Result<std::vector<Member>> ParseStaticPeers(std::string_view text);

class StaticMembership final : public Membership {
 public:
  // metrics may be null; otherwise it must outlive the membership.
  static Result<std::unique_ptr<StaticMembership>> Open(const StaticMembershipOptions& options,
                                                        MetricsRegistry* metrics);

  // A peer says it runs as `incarnation`. Newer than the view's: publishes a
  // view listing it (view callbacks run on this thread). An older one (a
  // late message of a previous instance), this node's own id, or an id not
  // in the list change nothing. Returns whether a view was published.
  bool ObservePeer(const std::string& node_id, uint64_t incarnation);

 private:
  StaticMembership(std::string node_id, MetricsRegistry* metrics);

  std::mutex observe_mu_;  // one publisher at a time (Membership::Publish)
};

}  // namespace kvpool
