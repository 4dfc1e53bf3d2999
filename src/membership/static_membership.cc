#include "membership/static_membership.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

namespace kvpool {
namespace {

bool ValidAddress(std::string_view a) {
  size_t colon = a.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == a.size()) return false;
  int port = 0;
  auto p = a.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  return ec == std::errc() && ptr == p.data() + p.size() && port > 0 && port < 65536;
}

}  // namespace

Status StaticMembershipOptions::Validate() const {
  if (node_id.empty()) return InvalidArgument("static membership: node_id is empty");
  std::set<std::string> ids;
  bool self = false;
  for (const Member& m : peers) {
    if (m.node_id.empty()) return InvalidArgument("static membership: a peer has no id");
    if (!ids.insert(m.node_id).second) {
      return InvalidArgument("static membership: duplicate peer id " + m.node_id);
    }
    if (!ValidAddress(m.address)) {
      return InvalidArgument("static membership: bad address '" + m.address + "' for " +
                             m.node_id);
    }
    if (!std::isfinite(m.weight) || m.weight < 0) {
      return InvalidArgument("static membership: bad weight for " + m.node_id);
    }
    self |= m.node_id == node_id;
  }
  if (!self) return InvalidArgument("static membership: " + node_id + " is not in peers");
  return Status::Ok();
}

Result<std::vector<Member>> ParseStaticPeers(std::string_view text) {
  std::vector<Member> out;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return InvalidArgument("peers: expected id=host:port, got '" + std::string(item) + "'");
    }
    Member m;
    m.node_id = std::string(item.substr(0, eq));
    std::string_view rest = item.substr(eq + 1);
    size_t star = rest.find('*');
    if (star != std::string_view::npos) {
      std::string w(rest.substr(star + 1));
      char* end = nullptr;
      m.weight = std::strtod(w.c_str(), &end);
      if (w.empty() || *end != '\0' || !std::isfinite(m.weight) || m.weight < 0) {
        return InvalidArgument("peers: bad weight in '" + std::string(item) + "'");
      }
      rest = rest.substr(0, star);
    }
    m.address = std::string(rest);
    if (!ValidAddress(m.address)) {
      return InvalidArgument("peers: bad address in '" + std::string(item) + "'");
    }
    out.push_back(std::move(m));
  }
  return out;
}

StaticMembership::StaticMembership(std::string node_id, MetricsRegistry* metrics)
    : Membership(std::move(node_id), metrics) {}

Result<std::unique_ptr<StaticMembership>> StaticMembership::Open(
    const StaticMembershipOptions& options, MetricsRegistry* metrics) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<StaticMembership> m(new StaticMembership(options.node_id, metrics));
  std::vector<Member> members = options.peers;
  for (Member& p : members) {
    p.state = MemberState::kAlive;
    p.incarnation = p.node_id == options.node_id ? options.incarnation : 0;
  }
  m->SetIncarnation(options.incarnation);
  m->Publish(std::move(members), /*epoch=*/1);
  return m;
}

bool StaticMembership::ObservePeer(const std::string& id, uint64_t incarnation) {
  if (id == node_id() || incarnation == 0) return false;
  std::lock_guard lock(observe_mu_);
  auto current = view();
  const Member* m = current->Find(id);
  if (m == nullptr || incarnation <= m->incarnation) return false;
  std::vector<Member> members = current->members;
  for (Member& p : members) {
    if (p.node_id == id) p.incarnation = incarnation;
  }
  return Publish(std::move(members), current->epoch + 1);
}

}  // namespace kvpool
