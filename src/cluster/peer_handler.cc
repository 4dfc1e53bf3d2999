#include "cluster/peer_handler.h"

#include <string>
#include <utility>

namespace kvpool::cluster {

using transport::Incoming;
using transport::Responder;

Status NotServing(const Cluster& cluster) {
  if (cluster.joining()) return Aborted("node is joining the cluster");
  return Unavailable("node is fenced");
}

void RespondWithBody(Responder& r, std::vector<uint8_t> body) {
  auto held = std::make_shared<std::vector<uint8_t>>(std::move(body));
  transport::ServerReply reply;
  reply.status = Status::Ok();
  reply.payload = *held;
  reply.release = [held] {};
  r.Respond(std::move(reply));
}

void ServePeer(Cluster* cluster, MetricsRegistry* metrics, const PeerHandlerSpec& spec,
               PeerHandlerBody body) {
  struct Counters {
    Counter* requests = nullptr;
    Counter* refused = nullptr;
    Counter* bad = nullptr;
  } c;
  if (metrics != nullptr) {
    const Labels label = {{"type", std::string(spec.name)}};
    c.requests = metrics->GetCounter("kvpool_peer_requests_total",
                                     "Peer requests that arrived, by message type", label);
    c.refused = metrics->GetCounter(
        "kvpool_peer_refused_total",
        "Peer requests refused because this node was fenced or joining, by message type", label);
    c.bad = metrics->GetCounter("kvpool_peer_bad_requests_total",
                                "Malformed peer requests refused, by message type", label);
  }
  const bool refuse_fenced = spec.when_fenced == WhenFenced::kRefuse;
  cluster->transport()->RegisterHandler(
      spec.type, [cluster, c, refuse_fenced, body = std::move(body)](Incoming in, Responder r) {
        if (c.requests != nullptr) c.requests->Inc();
        if (refuse_fenced && cluster->fenced()) {
          if (c.refused != nullptr) c.refused->Inc();
          return r.Respond(NotServing(*cluster));
        }
        Status s = body(in, r);
        if (s.ok()) return;
        if (s.code() == StatusCode::kInvalidArgument && c.bad != nullptr) c.bad->Inc();
        r.Respond(std::move(s));
      });
}

}  // namespace kvpool::cluster
