// Transport: request/reply RPC between kvpool nodes (the peer path).
//
// A node is named by its peer address "host:port". The server side registers
// one handler per message type; a handler gets the request and answers through
// a Responder exactly once, possibly later and from another thread. The
// client side calls Call() (asynchronous, with a callback) or CallSync().
//
// Every call finishes by its deadline: a timeout is DeadlineExceeded, a dead
// or unreachable peer is Unavailable, never a hang. A reply that arrives after
// its call finished is dropped. A large payload travels beside the small
// message header and can land straight in a buffer the caller names (the
// `sink`, e.g. a DRAM slot), so a remote get needs no intermediate copy.
//
// Implementations: UcxTransport (ucx_transport.h, the real one),
// InProcessNetwork/LocalTransport (in_process_transport.h, for tests of the
// logic above) and FaultTransport (fault_transport.h, fault injection).
//
// Thread-safe: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpool::transport {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;
// Application message type; the transport only routes by it.
using MessageType = uint16_t;

// Hard caps on incoming lengths, checked before anything is allocated.
struct TransportLimits {
  // The small message bytes of a request or reply. UCX carries them in the
  // active-message header, so the UCX transport may lower this to what the
  // worker supports.
  size_t max_header_bytes = 16 * 1024;
  // A value (64 MiB) plus room for its framing.
  size_t max_payload_bytes = (64u << 20) + (1u << 20);
};

// What a call produced. `status` is the transport's verdict (DeadlineExceeded,
// Unavailable, ResourceExhausted when a payload does not fit the sink, ...) or,
// when the peer answered, the status its handler sent.
struct Reply {
  Status status;
  std::vector<uint8_t> header;  // the reply message bytes (empty on error)
  // Payload bytes received. With a sink they are in sink[0, payload_bytes);
  // without one they are in `payload`.
  size_t payload_bytes = 0;
  std::vector<uint8_t> payload;
};
using ReplyCallback = std::function<void(Reply)>;

// One outgoing call. The spans are not owned: request is copied before Call()
// returns; payload and sink must stay valid until the callback has run.
struct CallArgs {
  std::string peer;                    // "host:port"
  MessageType type = 0;
  std::span<const uint8_t> request;    // small message bytes (<= max header bytes)
  std::span<const uint8_t> payload;    // optional large payload sent with it
  std::span<uint8_t> sink;             // optional destination for the reply payload
                                       // (given when data() is non-null)
  Deadline deadline;
};

// A handler's answer. `payload` is not copied: it must stay valid until
// `release` runs (on a transport thread, once the bytes are sent or dropped),
// which lets a handler answer from a pinned DRAM entry without a copy.
struct ServerReply {
  Status status;
  std::vector<uint8_t> header;
  std::span<const uint8_t> payload;
  std::function<void()> release;  // may be empty
};

// Answers one request exactly once. Move-only. Destroying a Responder that has
// not answered sends Internal("request dropped by handler"), so a lost
// responder fails the call fast instead of leaving it to the deadline.
class Responder {
 public:
  Responder() = default;
  explicit Responder(std::function<void(ServerReply)> send) : send_(std::move(send)) {}
  Responder(Responder&&) noexcept = default;
  Responder& operator=(Responder&& other) noexcept;
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder();

  // REQUIRES: not answered yet (CHECKed).
  void Respond(ServerReply reply);
  void Respond(Status status, std::vector<uint8_t> header = {}) {
    Respond(ServerReply{std::move(status), std::move(header), {}, nullptr});
  }
  bool answered() const { return !send_; }

 private:
  std::function<void(ServerReply)> send_;  // empty once answered
};

// A request as a handler sees it. The spans are valid only until the handler
// returns; copy what must outlive it.
struct Incoming {
  std::string peer;  // the sender's transport-level address (for logs)
  MessageType type = 0;
  std::span<const uint8_t> request;
  std::span<const uint8_t> payload;
  Deadline deadline;  // the caller's deadline, as seen locally
  // Empty for a member (a node, or any peer of a cluster without keys); a
  // client's name when the connection was authenticated with its token.
  std::string principal;
};
// Handlers run on a transport thread and must not block on the network.
using Handler = std::function<void(Incoming request, Responder responder)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // The address peers reach this node at ("host:port", bound port filled in).
  virtual std::string address() const = 0;

  // Replaces the handler for `type`. Requests of a type without a handler are
  // answered InvalidArgument.
  virtual void RegisterHandler(MessageType type, Handler handler) = 0;

  // Starts a call; `done` runs exactly once, on a transport thread, never
  // inside Call() itself, and no later than the deadline plus scheduling
  // slack (a payload still landing in the sink at the deadline is aborted
  // first, so the sink is never written after `done` runs).
  virtual void Call(const CallArgs& args, ReplyCallback done) = 0;

  // Refuses new calls (their `done` runs inside Call()) and fails the calls in
  // flight; where the transport has its own threads, their callbacks have run
  // when it returns. The owner stops a transport while what its callbacks use
  // is still alive; the destructor stops it too. The default does nothing: for
  // transports whose destructor is enough. REQUIRES: not called from a
  // transport thread.
  virtual void Stop() {}

  // Blocking convenience. REQUIRES: not called from a transport thread.
  Reply CallSync(const CallArgs& args);
};

// Helpers for tests and tools.
inline std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
inline std::string_view AsString(std::span<const uint8_t> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace kvpool::transport
