// StaticMembership: a fixed member list (the --peers setting), for clusters
// without etcd. The one view is published at Open() and never changes; a
// static node is never fenced. Peers' incarnations are unknown (0), so a
// restarted peer cannot be told from its previous life. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/membership.h"
#include "common/status.h"

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

 private:
  StaticMembership(std::string node_id, MetricsRegistry* metrics);
};

}  // namespace kvpool
