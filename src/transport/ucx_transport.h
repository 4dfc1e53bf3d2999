// UcxTransport: the Transport over UCX (ucp) active messages.
//
// Owns one UCX context and one worker, driven by exactly one thread: the
// node's UCX progress thread. Every ucp call (setup, sends, receives, endpoint
// creation and teardown) runs on that thread; other threads hand it work
// through a submission queue and an eventfd, and it sleeps in epoll on the
// worker's event fd when idle. It also enforces call deadlines.
//
// Connections start on kvpool's own TCP listener, the peer port: a short,
// bounded bootstrap (bootstrap_format.h) gives the connector the listener's
// UCX worker address and a connection token, and its TCP connection then
// stays open beside the UCX endpoint as the connection's liveness signal.
// Nothing a connector sends is handed to UCX: the listener answers on the
// reply endpoint UCX gives it with each request. UCX's own TCP listener is
// confined to the interface of listen_host (net_devices).
//
// Requests and replies are active messages (peer_format.h); payloads above
// UCX's rendezvous threshold go by rendezvous and land directly in the
// receiver's buffer (the caller's sink for replies), zero-copy where the
// transport allows (RDMA, CMA), through TCP otherwise. Endpoints use peer
// error handling: a failed endpoint fails its calls Unavailable and is
// recreated by the next call to that peer. Malformed or oversized messages
// are counted (kvpool_transport_errors_total{reason}) and close the endpoint.
//
// Handlers run on the progress thread unless an executor is given; callbacks
// run on the progress thread and must not block.
// Thread-safe. Destruction fails the calls still in flight (Unavailable).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/executor.h"
#include "common/metrics.h"
#include "common/status.h"
#include "transport/peer_auth.h"
#include "transport/transport.h"

namespace kvpool::transport {

struct UcxTransportOptions {
  // Address the peer port binds ("0.0.0.0" for all) and its port (0: any
  // free). The peer port is kvpool's own TCP listener: it reads nothing but
  // the bootstrap (bootstrap_format.h) and is bound with SO_REUSEADDR, so a
  // restarted node takes its port back at once.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // False: a client-only transport (the remote-mode client) with no peer
  // port; it can call nodes but nobody can call it.
  bool listen = true;
  // UCX network devices (the UCX_NET_DEVICES value, e.g. "eth0" or
  // "mlx5_0:1"). Empty: the interface that holds listen_host, so UCX's own
  // TCP listener sits on the configured address only; UCX's choice (every
  // device) when listen_host is a wildcard or the transport does not listen.
  std::string net_devices;
  // UCX TCP send and receive segment size (0: UCX's default, 8 KiB). A
  // large payload moves in segments of this size; larger segments cost
  // memory per receiving connection and carry bulk transfers faster.
  size_t tcp_segment_bytes = 256 * 1024;
  // A connection to the peer port must finish its bootstrap within this, and
  // at most max_bootstrapping connections may be in their bootstrap at once
  // (more are refused at accept): a flood of idle or slow connections costs a
  // bounded number of sockets for a bounded time.
  std::chrono::milliseconds bootstrap_timeout{3000};
  uint32_t max_bootstrapping = 128;
  // Host put in address(); empty means listen_host.
  std::string advertise_host;
  // Cluster authentication (peer_auth.h): with keys, every connection, in
  // both directions, is mutually authenticated in its bootstrap before any
  // request is sent or handled; a connector initiates with the first key and
  // a listener accepts each. A peer without a key, or with another, is
  // refused (PermissionDenied to its caller), counted in
  // kvpool_transport_bootstrap_refused_total{reason} and logged at most once
  // a second. Empty: no authentication (loopback-only or --insecure
  // clusters); such a transport refuses a connector that offers it.
  std::vector<ClusterKey> cluster_keys;
  // Client tokens (peer_auth.h, LoadClientTokenFile) this listener accepts
  // besides the cluster keys. A connection authenticated with one is a
  // client's: it may send only client_message_types (others are answered
  // PermissionDenied, counted in kvpool_transport_errors_total{reason=
  // "client_message_refused"}), and its requests carry the client's name
  // (Incoming::principal).
  std::vector<ClusterKey> client_tokens;
  std::vector<MessageType> client_message_types;
  // Encrypt every connection this side makes or accepts (peer_seal.h):
  // headers and payloads under AES-256-GCM with keys derived in the
  // handshake, so it needs keys (cluster_keys). A connection is encrypted
  // when either side asks, so a connector without this follows a listener
  // with it; a connector with it refuses a listener that would not
  // encrypt. A message that fails its check (tampered, forged, replayed)
  // is dropped, counted in kvpool_transport_errors_total{reason="bad_seal"
  // or "replayed_message"}, and its connection closed.
  bool peer_encryption = false;
  // This side's name in the handshake (a node's id and incarnation, "a/3");
  // it is inside both sides' MACs. SetIdentity changes it later.
  std::string identity;
  // UCX transports (the UCX_TLS value, e.g. "tcp" or "rc,sm"), applied with
  // ucp_config_modify; empty keeps UCX's choice (and the environment's).
  std::string tls;
  TransportLimits limits;
  // Open peer connections (both directions) at most. A new outgoing one at
  // the limit first closes this side's least recently used outgoing
  // connection with no call in flight; without one it is refused, as an
  // incoming one at the limit is.
  uint32_t max_endpoints = 4096;
  // An outgoing connection with no call in flight for this long is closed
  // (kvpool_transport_idle_closed_total); the next call to that peer
  // connects again. The peer closes its side when it sees the close. So a
  // node holds connections to the peers it talks to now, not to every peer
  // it ever called. 0: never.
  std::chrono::milliseconds idle_close{std::chrono::minutes(2)};
  // Where handlers run; null runs them on the progress thread (they must then
  // be quick and non-blocking). Not owned; must outlive the transport.
  Executor* handler_executor = nullptr;
  // Requests that arrive in one progress pass are handed to the executor
  // together, up to this many per task: fewer thread hand-offs for a burst
  // (a batch of fetches), but a handler that waits delays the others of its
  // task. 1: one task per request.
  size_t max_handler_batch = 16;
  // How long the progress thread keeps polling after its last work before
  // it sleeps (0: sleep at once). Saves a sleep and wake-up per segment of
  // a transfer stream; an idle transport does not poll.
  std::chrono::microseconds progress_spin{50};
  // Optional region (the DRAM segment) registered with ucp_mem_map up front,
  // so RDMA-capable transports move it without per-call registration.
  std::span<uint8_t> registered_region;
  // Metrics registry; null keeps a private one. Not owned.
  MetricsRegistry* metrics = nullptr;
  // How long shutdown waits for endpoints to close.
  std::chrono::milliseconds close_timeout{1000};

  Status Validate() const;
};

// Whether UCX may use its TCP transport with its own data port left to the
// system, from the values of UCX_TLS and UCX_TCP_PORT_RANGE (null: unset).
// TCP is possible when UCX_TLS is unset, empty, "all", lists tcp, or is an
// exclusion ("^...") that does not; the port is pinned when
// UCX_TCP_PORT_RANGE is set to anything but "" or "0". UCX authenticates
// nothing on that port (docs/cluster.md, "UCX's own port").
bool UcxTcpPortUnpinned(const char* ucx_tls, const char* ucx_tcp_port_range);

class UcxTransport final : public Transport {
 public:
  // Creates the context, worker and listener and starts the progress thread.
  static Result<std::unique_ptr<UcxTransport>> Open(const UcxTransportOptions& options);
  ~UcxTransport() override;

  std::string address() const override;
  // The identity used in later handshakes (e.g. once the incarnation is known).
  void SetIdentity(std::string identity);
  uint16_t port() const;
  void RegisterHandler(MessageType type, Handler handler) override;
  void Call(const CallArgs& args, ReplyCallback done) override;
  void Stop() override;

  struct Core;

 private:
  explicit UcxTransport(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

}  // namespace kvpool::transport
