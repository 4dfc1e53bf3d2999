// UcxTransport: the Transport over UCX (ucp) active messages.
//
// Owns one UCX context and one worker, driven by exactly one thread: the
// node's UCX progress thread. Every ucp call (setup, sends, receives, endpoint
// creation and teardown) runs on that thread; other threads hand it work
// through a submission queue and an eventfd, and it sleeps in epoll on the
// worker's event fd when idle. It also enforces call deadlines.
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

#include "common/executor.h"
#include "common/metrics.h"
#include "common/status.h"
#include "transport/transport.h"

namespace kvpool::transport {

struct UcxTransportOptions {
  // Address the listener binds ("0.0.0.0" for all) and its port (0: any free).
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // Host put in address(); empty means listen_host.
  std::string advertise_host;
  // UCX transports (the UCX_TLS value, e.g. "tcp" or "rc,sm"), applied with
  // ucp_config_modify; empty keeps UCX's choice (and the environment's).
  std::string tls;
  TransportLimits limits;
  // Open connections accepted at most; more are rejected (a pre-auth cap).
  uint32_t max_endpoints = 4096;
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

class UcxTransport final : public Transport {
 public:
  // Creates the context, worker and listener and starts the progress thread.
  static Result<std::unique_ptr<UcxTransport>> Open(const UcxTransportOptions& options);
  ~UcxTransport() override;

  std::string address() const override;
  uint16_t port() const;
  void RegisterHandler(MessageType type, Handler handler) override;
  void Call(const CallArgs& args, ReplyCallback done) override;

  struct Core;

 private:
  explicit UcxTransport(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

}  // namespace kvpool::transport
