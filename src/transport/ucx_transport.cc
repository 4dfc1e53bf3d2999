#include "transport/ucx_transport.h"

#include <sys/eventfd.h>

#include <future>
#include <string_view>

#include "transport/ucx_core.h"

namespace kvpool::transport {

bool UcxTcpPortUnpinned(const char* ucx_tls, const char* range) {
  if (range != nullptr && *range != '\0' && std::string_view(range) != "0") return false;
  if (ucx_tls == nullptr || *ucx_tls == '\0') return true;
  const std::string_view tls(ucx_tls);
  const bool listed = tls.find("tcp") != std::string_view::npos;
  if (tls.front() == '^') return !listed;  // "^X,Y": all but those
  return listed || tls.find("all") != std::string_view::npos;
}

Status UcxTransportOptions::Validate() const {
  if (listen_host.empty()) return InvalidArgument("listen_host is empty");
  if (limits.max_header_bytes == 0) return InvalidArgument("max_header_bytes is 0");
  if (limits.max_payload_bytes == 0) return InvalidArgument("max_payload_bytes is 0");
  if (max_endpoints == 0) return InvalidArgument("max_endpoints is 0");
  if (max_bootstrapping == 0) return InvalidArgument("max_bootstrapping is 0");
  if (idle_close < std::chrono::milliseconds(0)) return InvalidArgument("idle_close is negative");
  if (bootstrap_timeout <= std::chrono::milliseconds(0)) {
    return InvalidArgument("bootstrap_timeout must be positive");
  }
  if (max_handler_batch == 0) return InvalidArgument("max_handler_batch is 0");
  if (progress_spin < std::chrono::microseconds(0) || progress_spin > std::chrono::milliseconds(10)) {
    return InvalidArgument("progress_spin must be within 0..10 ms");
  }
  if (cluster_keys.size() > 2) return InvalidArgument("at most two cluster keys");
  if (peer_encryption && cluster_keys.empty()) {
    return InvalidArgument("peer encryption needs a cluster key (its keys come from the handshake)");
  }
  if (identity.size() > kMaxAuthIdentityBytes) {
    return InvalidArgument("identity is longer than 256 bytes");
  }
  return Status::Ok();
}

Result<std::unique_ptr<UcxTransport>> UcxTransport::Open(const UcxTransportOptions& options) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto core = std::make_shared<Core>(options);
  core->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (core->wake_fd < 0) return ErrnoStatus("eventfd", errno);
  std::promise<Status> started;
  std::future<Status> result = started.get_future();
  // Setup runs on the progress thread too, so one thread makes every ucp call.
  core->thread = std::thread([c = core.get(), &started] {
    Status st = c->Init();
    bool ok = st.ok();
    if (!ok) c->Shutdown();
    started.set_value(std::move(st));
    if (!ok) return;
    c->Loop();
    c->Shutdown();
  });
  Status st = result.get();
  if (!st.ok()) {
    core->thread.join();
    close(core->wake_fd);
    return st;
  }
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(core)));
}

Result<sockaddr_storage> UcxTransport::Core::Lookup(const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(addr_mu);
    auto it = addr_cache.find(peer);
    if (it != addr_cache.end()) return it->second;
  }
  std::string host;
  uint16_t port = 0;
  if (!SplitAddress(peer, &host, &port)) return InvalidArgument("bad peer address \"" + peer + "\"");
  // Resolved on the caller's thread: the progress thread never blocks on DNS.
  Result<sockaddr_storage> addr = Resolve(host, port);
  if (addr.ok()) {
    std::lock_guard<std::mutex> lock(addr_mu);
    addr_cache[peer] = *addr;
  }
  return addr;
}

UcxTransport::UcxTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}

void UcxTransport::Stop() { core_->Stop(); }

UcxTransport::~UcxTransport() {
  core_->Stop();
  close(core_->wake_fd);
  core_->wake_fd = -1;
}

std::string UcxTransport::address() const { return core_->address; }
uint16_t UcxTransport::port() const { return core_->port; }

void UcxTransport::SetIdentity(std::string identity) {
  Core* c = core_.get();
  c->Submit([c, id = std::move(identity)]() mutable { c->identity = std::move(id); });
}

void UcxTransport::RegisterHandler(MessageType type, Handler handler) {
  std::lock_guard<std::mutex> lock(core_->handlers_mu);
  core_->handlers[type] = std::move(handler);
}

void UcxTransport::Call(const CallArgs& args, ReplyCallback done) {
  Core* c = core_.get();
  uint64_t id = c->next_request_id.fetch_add(1, std::memory_order_relaxed);
  bool fits = args.request.size() <= c->limits.max_header_bytes &&
              args.payload.size() <= c->limits.max_payload_bytes;
  Result<sockaddr_storage> addr =
      fits ? c->Lookup(args.peer) : Result<sockaddr_storage>(InvalidArgument("request over the size limits"));
  Frame f;
  f.kind = FrameKind::kRequest;
  f.type = args.type;
  f.request_id = id;
  f.payload_len = args.payload.size();
  auto left =
      std::chrono::ceil<std::chrono::milliseconds>(args.deadline - SteadyClock::now()).count();
  f.budget_ms = static_cast<uint32_t>(std::clamp<int64_t>(left, 0, UINT32_MAX));
  std::vector<uint8_t> am_header = fits ? EncodeFrame(f, args.request) : std::vector<uint8_t>();
  auto shared_done = std::make_shared<ReplyCallback>(std::move(done));
  bool queued = c->Submit([c, id, peer = args.peer, addr = std::move(addr),
                           am_header = std::move(am_header), payload = args.payload,
                           sink = args.sink, deadline = args.deadline, shared_done]() mutable {
    c->StartCall(id, std::move(peer), std::move(addr), std::move(am_header), payload, sink,
                 deadline, std::move(*shared_done));
  });
  // Only a transport being destroyed refuses work; there is no thread left to
  // run the callback on, so it runs here.
  if (!queued) (*shared_done)(Reply{Unavailable("transport shut down"), {}, 0, {}});
}

}  // namespace kvpool::transport
