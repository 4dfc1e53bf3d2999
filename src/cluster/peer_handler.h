// The shared work around every peer message handler, done here once: what
// a fenced node answers, how a malformed request is answered and counted,
// and how many requests of each type arrived. A component registers each of
// its message types with ServePeer and writes only the body: decode, act,
// answer.
//
//   kvpool_peer_requests_total{type}      every request that arrived
//   kvpool_peer_refused_total{type}       refused while fenced or joining
//   kvpool_peer_bad_requests_total{type}  malformed (InvalidArgument)
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "cluster/cluster.h"
#include "common/metrics.h"
#include "common/status.h"
#include "transport/transport.h"

namespace kvpool::cluster {

enum class WhenFenced {
  kRefuse,  // a fenced or joining node answers NotServing (the default)
  kServe,   // served regardless: the lease probe and the status figures
};

struct PeerHandlerSpec {
  transport::MessageType type = 0;
  std::string_view name;  // the metrics' `type` label: "lookup", "tenant_fetch", ...
  WhenFenced when_fenced = WhenFenced::kRefuse;
};

// A handler's body. It answers through `r`, at once or later (moving it
// away). Returning a non-OK status means it has not answered: the wrapper
// answers with that status, counting InvalidArgument as a malformed request.
using PeerHandlerBody = std::function<Status(transport::Incoming& in, transport::Responder& r)>;

// Registers `body` for spec.type on the cluster's transport, wrapped as the
// header says. `metrics` may be null (nothing counted).
void ServePeer(Cluster* cluster, MetricsRegistry* metrics, const PeerHandlerSpec& spec,
               PeerHandlerBody body);

// What a node that does not serve peers answers: Aborted while it joins
// after a restart (alive and about to serve: callers miss without cooling
// down), Unavailable while fenced.
Status NotServing(const Cluster& cluster);

// Answers OK with `body` as the payload, kept until the transport sent it.
void RespondWithBody(transport::Responder& r, std::vector<uint8_t> body);

// Answers OK with the body `encode(std::vector<uint8_t>*)` writes.
template <typename Encode>
void RespondEncoded(transport::Responder& r, Encode&& encode) {
  std::vector<uint8_t> body;
  encode(&body);
  RespondWithBody(r, std::move(body));
}

}  // namespace kvpool::cluster
