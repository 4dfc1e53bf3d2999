#include "transport/transport.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

namespace kvpool::transport {

Responder& Responder::operator=(Responder&& other) noexcept {
  if (this != &other) {
    if (send_) send_(ServerReply{Internal("request dropped by handler"), {}, {}, nullptr});
    send_ = std::move(other.send_);
    other.send_ = nullptr;
  }
  return *this;
}

Responder::~Responder() {
  if (send_) send_(ServerReply{Internal("request dropped by handler"), {}, {}, nullptr});
}

void Responder::Respond(ServerReply reply) {
  KVPOOL_CHECK(send_);
  auto send = std::move(send_);
  send_ = nullptr;
  send(std::move(reply));
}

Reply Transport::CallSync(const CallArgs& args) {
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Reply> reply;
  };
  // Shared so that the callback never touches a waiter that has returned.
  auto w = std::make_shared<Waiter>();
  Call(args, [w](Reply r) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->reply = std::move(r);
    w->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(w->mu);
  // The transport guarantees the callback; the wait has no timeout of its own
  // because returning early would let the caller free a sink still in use.
  w->cv.wait(lock, [&] { return w->reply.has_value(); });
  return std::move(*w->reply);
}

}  // namespace kvpool::transport
