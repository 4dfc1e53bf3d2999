// FaultTransport: wraps a Transport and injects network faults into the
// calls made through it: a delay (base plus uniform jitter) before a request
// leaves, dropped requests (the call then times out at its deadline), and
// "reset" peers whose calls fail Unavailable at once. Faults apply per peer
// address, or to every peer through the default rule. The server side
// (handlers) passes through unchanged.
//
// The wrapper owns one timer thread for delays and dropped calls. Thread-safe;
// the knobs may be changed while calls are in flight (a change applies to
// calls started after it). The inner transport must outlive the wrapper.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace kvpool::transport {

struct FaultRule {
  std::chrono::microseconds delay{0};   // added before the request is sent
  std::chrono::microseconds jitter{0};  // plus uniform [0, jitter]
  double drop_probability = 0;          // 0..1: the request vanishes
  bool unavailable = false;             // the peer looks dead (reset)
};

class FaultTransport final : public Transport {
 public:
  // `seed` makes the drop and jitter choices reproducible.
  explicit FaultTransport(Transport* inner, uint64_t seed = 1);
  ~FaultTransport() override;

  // The rule for one peer, or for peers without their own rule.
  void SetRule(const std::string& peer, const FaultRule& rule);
  void SetDefaultRule(const FaultRule& rule);
  void ClearRules();

  std::string address() const override;
  void RegisterHandler(MessageType type, Handler handler) override;
  void Call(const CallArgs& args, ReplyCallback done) override;
  void Stop() override { inner_->Stop(); }

 private:
  struct State;
  std::shared_ptr<State> state_;
  Transport* inner_;  // not owned
};

}  // namespace kvpool::transport
