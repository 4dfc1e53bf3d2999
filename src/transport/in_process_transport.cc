#include "transport/in_process_transport.h"

#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"

namespace kvpool::transport {

struct LocalTransport::Node {
  std::string address;
  std::mutex mu;
  std::unordered_map<MessageType, Handler> handlers;  // protected by mu
};

namespace {
struct PendingCall {
  std::shared_ptr<LocalTransport::Node> from;
  std::string to;
  std::span<uint8_t> sink;
  ReplyCallback done;
};
}  // namespace

struct InProcessNetwork::Core : std::enable_shared_from_this<InProcessNetwork::Core> {
  explicit Core(TransportLimits l) : limits(l) {}

  TransportLimits limits;
  std::mutex mu;
  std::condition_variable cv;
  // Events by due time; the sequence number keeps FIFO order among equals.
  std::multimap<std::pair<Deadline, uint64_t>, std::function<void()>> events;  // protected by mu
  uint64_t next_seq = 0;                                                         // protected by mu
  std::unordered_map<std::string, std::shared_ptr<LocalTransport::Node>> nodes;  // protected by mu
  std::unordered_map<uint64_t, PendingCall> pending;                             // protected by mu
  uint64_t next_call = 1;                                                        // protected by mu
  bool stopping = false;                                                         // protected by mu
  std::thread thread;

  // REQUIRES: mu held.
  void PostLocked(Deadline when, std::function<void()> fn) {
    events.emplace(std::make_pair(when, next_seq++), std::move(fn));
    cv.notify_one();
  }
  void Post(Deadline when, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu);
    PostLocked(when, std::move(fn));
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      if (stopping && events.empty()) return;
      if (events.empty()) {
        cv.wait(lock);
        continue;
      }
      auto it = events.begin();
      if (it->first.first > SteadyClock::now() && !stopping) {
        cv.wait_until(lock, it->first.first);
        continue;
      }
      auto fn = std::move(it->second);
      events.erase(it);
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  // Removes the call and runs its callback; false when it already finished.
  bool Finish(uint64_t id, Reply reply) {
    ReplyCallback done;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = pending.find(id);
      if (it == pending.end()) return false;
      done = std::move(it->second.done);
      pending.erase(it);
    }
    done(std::move(reply));
    return true;
  }

  void Deliver(uint64_t id, MessageType type, std::vector<uint8_t> request,
               std::vector<uint8_t> payload, Deadline deadline) {
    std::shared_ptr<LocalTransport::Node> target;
    std::string from;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto p = pending.find(id);
      if (p == pending.end()) return;  // timed out before delivery
      auto n = nodes.find(p->second.to);
      if (n != nodes.end()) target = n->second;
      from = p->second.from->address;
    }
    if (target == nullptr) {
      Finish(id, Reply{Unavailable("no node at this address"), {}, 0, {}});
      return;
    }
    Handler handler;
    {
      std::lock_guard<std::mutex> lock(target->mu);
      auto h = target->handlers.find(type);
      if (h != target->handlers.end()) handler = h->second;
    }
    if (!handler) {
      Finish(id, Reply{InvalidArgument("no handler for message type"), {}, 0, {}});
      return;
    }
    std::weak_ptr<Core> weak = weak_from_this();
    Responder responder([weak, id](ServerReply r) {
      auto core = weak.lock();
      if (core == nullptr) {
        if (r.release) r.release();
        return;
      }
      // Replies are delivered on the network thread, like every event.
      auto shared = std::make_shared<ServerReply>(std::move(r));
      core->Post(SteadyClock::now(), [core_raw = core.get(), id, shared] {
        core_raw->DeliverReply(id, std::move(*shared));
      });
    });
    handler(Incoming{from, type, request, payload, deadline, {}}, std::move(responder));
  }

  void DeliverReply(uint64_t id, ServerReply r) {
    Reply reply;
    std::span<uint8_t> sink;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = pending.find(id);
      if (it == pending.end()) {  // late: the call already finished
        if (r.release) r.release();
        return;
      }
      sink = it->second.sink;
    }
    // Only this thread finishes calls, so the call stays pending meanwhile.
    reply.status = std::move(r.status);
    if (reply.status.ok()) {
      reply.header = std::move(r.header);
      if (r.payload.size() > limits.max_payload_bytes) {
        reply.status = ResourceExhausted("reply payload over the limit");
      } else if (sink.data() != nullptr) {
        if (r.payload.size() > sink.size()) {
          reply.status = ResourceExhausted("reply payload larger than the sink");
          reply.header.clear();
        } else {
          if (!r.payload.empty()) std::memcpy(sink.data(), r.payload.data(), r.payload.size());
          reply.payload_bytes = r.payload.size();
        }
      } else {
        reply.payload.assign(r.payload.begin(), r.payload.end());
        reply.payload_bytes = r.payload.size();
      }
    }
    if (r.release) r.release();
    Finish(id, std::move(reply));
  }
};

InProcessNetwork::InProcessNetwork(TransportLimits limits)
    : core_(std::make_shared<Core>(limits)) {
  core_->thread = std::thread([core = core_.get()] { core->Loop(); });
}

InProcessNetwork::~InProcessNetwork() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    KVPOOL_CHECK(core_->nodes.empty());  // the network must outlive its nodes
    core_->stopping = true;
    core_->cv.notify_one();
  }
  core_->thread.join();
}

std::unique_ptr<LocalTransport> InProcessNetwork::AddNode(const std::string& address) {
  auto node = std::make_shared<LocalTransport::Node>();
  node->address = address;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    KVPOOL_CHECK(core_->nodes.emplace(address, node).second);
  }
  return std::unique_ptr<LocalTransport>(new LocalTransport(core_, std::move(node)));
}

LocalTransport::LocalTransport(std::shared_ptr<InProcessNetwork::Core> core,
                               std::shared_ptr<Node> node)
    : core_(std::move(core)), node_(std::move(node)) {}

LocalTransport::~LocalTransport() {
  std::vector<uint64_t> to_fail;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->nodes.erase(node_->address);
    for (auto& [id, call] : core_->pending) {
      if (call.to == node_->address || call.from == node_) to_fail.push_back(id);
    }
    // Finished on the network thread, which is where callbacks always run.
    for (uint64_t id : to_fail) {
      core_->PostLocked(SteadyClock::now(), [core = core_.get(), id] {
        core->Finish(id, Reply{Unavailable("peer shut down"), {}, 0, {}});
      });
    }
  }
  // Then wait for the network thread to run everything queued so far: a
  // handler of this node running there returns, and replies this node's
  // handlers gave release what they hold (DRAM pins) before the node's
  // store can go. (Not from the network thread itself: a callback that
  // destroys a node cannot wait for itself.)
  if (std::this_thread::get_id() != core_->thread.get_id()) {
    std::promise<void> drained;
    auto f = drained.get_future();
    core_->Post(SteadyClock::now(), [&drained] { drained.set_value(); });
    f.wait();
  }
}

std::string LocalTransport::address() const { return node_->address; }

void LocalTransport::RegisterHandler(MessageType type, Handler handler) {
  std::lock_guard<std::mutex> lock(node_->mu);
  node_->handlers[type] = std::move(handler);
}

void LocalTransport::Call(const CallArgs& args, ReplyCallback done) {
  auto* core = core_.get();
  std::lock_guard<std::mutex> lock(core->mu);
  uint64_t id = core->next_call++;
  if (args.request.size() > core->limits.max_header_bytes ||
      args.payload.size() > core->limits.max_payload_bytes) {
    core->pending.emplace(id, PendingCall{node_, args.peer, args.sink, std::move(done)});
    core->PostLocked(SteadyClock::now(), [core, id] {
      core->Finish(id, Reply{InvalidArgument("request over the size limits"), {}, 0, {}});
    });
    return;
  }
  core->pending.emplace(id, PendingCall{node_, args.peer, args.sink, std::move(done)});
  core->PostLocked(args.deadline, [core, id] {
    core->Finish(id, Reply{DeadlineExceeded("call timed out"), {}, 0, {}});
  });
  std::vector<uint8_t> request(args.request.begin(), args.request.end());
  std::vector<uint8_t> payload(args.payload.begin(), args.payload.end());
  core->PostLocked(SteadyClock::now(),
                   [core, id, type = args.type, request = std::move(request),
                    payload = std::move(payload), deadline = args.deadline]() mutable {
                     core->Deliver(id, type, std::move(request), std::move(payload), deadline);
                   });
}

}  // namespace kvpool::transport
