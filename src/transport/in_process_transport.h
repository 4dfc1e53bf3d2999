// InProcessNetwork: several transport "nodes" in one process, exchanging
// messages through one event queue, with the same semantics as the UCX
// transport (deadlines, Unavailable for a missing or destroyed peer, late
// replies dropped, payloads landing in the caller's sink). For unit tests of
// the logic above the transport.
//
// The network owns one thread that delivers requests, runs handlers,
// delivers replies and fires deadlines, so a handler that blocks stalls the
// whole network (as it would stall a UCX progress thread). Thread-safe.
// The network must outlive its nodes.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace kvpool::transport {

class LocalTransport;

class InProcessNetwork {
 public:
  explicit InProcessNetwork(TransportLimits limits = {});
  ~InProcessNetwork();
  InProcessNetwork(const InProcessNetwork&) = delete;
  InProcessNetwork& operator=(const InProcessNetwork&) = delete;

  // A node reachable at `address` until it is destroyed. Calls to an address
  // with no live node fail Unavailable; destroying a node fails the calls in
  // flight to it (Unavailable) and its own calls (Unavailable), and waits
  // until its replies in flight have released what they hold.
  // REQUIRES: no live node has this address.
  std::unique_ptr<LocalTransport> AddNode(const std::string& address);

  struct Core;  // shared with nodes and responders

 private:
  std::shared_ptr<Core> core_;
};

class LocalTransport final : public Transport {
 public:
  ~LocalTransport() override;
  std::string address() const override;
  void RegisterHandler(MessageType type, Handler handler) override;
  void Call(const CallArgs& args, ReplyCallback done) override;

  struct Node;  // state shared with queued events

 private:
  friend class InProcessNetwork;
  LocalTransport(std::shared_ptr<InProcessNetwork::Core> core, std::shared_ptr<Node> node);
  std::shared_ptr<InProcessNetwork::Core> core_;
  std::shared_ptr<Node> node_;
};

}  // namespace kvpool::transport
