// The UCX progress thread: setup, the event loop, endpoints, calls and
// message handling. Everything here runs on that thread.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "transport/ucx_core.h"

namespace kvpool::transport {


// The one boundary where a UCX status becomes a Status. Anything that breaks a
// connection is Unavailable: the caller's next move is to try again or
// elsewhere.
Status FromUcs(ucs_status_t s, std::string_view what) {
  if (s == UCS_OK) return Status::Ok();
  std::string msg = fmt::format("{}: {}", what, ucs_status_string(s));
  switch (s) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return ResourceExhausted(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return InvalidArgument(msg);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM:
      return FailedPrecondition(msg);
    default:
      return Unavailable(msg);
  }
}

Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Unavailable(fmt::format("cannot resolve {}: {}", host, gai_strerror(rc)));
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return ss;
}

socklen_t AddrLen(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// "host:port" or "[v6]:port".
bool SplitAddress(const std::string& a, std::string* host, uint16_t* port) {
  size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon + 1 >= a.size()) return false;
  *host = a.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  char* end = nullptr;
  unsigned long p = std::strtoul(a.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p == 0 || p > 65535) return false;
  *port = static_cast<uint16_t>(p);
  return !host->empty();
}

std::string FormatAddr(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
    return fmt::format("[{}]:{}", buf, port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
  port = ntohs(a->sin_port);
  return fmt::format("{}:{}", buf, port);
}


Status UcxTransport::Core::Init() {
  ucp_config_t* config = nullptr;
  KVPOOL_RETURN_IF_ERROR(FromUcs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
  auto modify = [&](const char* name, const std::string& value, std::string_view what) {
    if (value.empty()) return Status::Ok();
    Status st = FromUcs(ucp_config_modify(config, name, value.c_str()), what);
    return st.ok() ? st : InvalidArgument(fmt::format("{} \"{}\": {}", what, value, st.message()));
  };
  Result<std::string> devices = NetDevices(opts);
  Status st = devices.ok() ? modify("TLS", opts.tls, "UCX TLS setting") : devices.status();
  if (st.ok()) st = modify("NET_DEVICES", *devices, "UCX network devices");
  // Without an RMA lane (UCX gives none to TCP endpoints made from worker
  // addresses), a rendezvous payload moves as active-message segments of
  // this size (UCX's default 8 KiB).
  if (st.ok() && opts.tcp_segment_bytes > 0) {
    std::string seg = std::to_string(opts.tcp_segment_bytes);
    st = modify("TX_SEG_SIZE", seg, "UCX TCP segment size");
    if (st.ok()) st = modify("RX_SEG_SIZE", seg, "UCX TCP segment size");
  }
  if (!st.ok()) {
    ucp_config_release(config);
    return st;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  KVPOOL_RETURN_IF_ERROR(FromUcs(s, "ucp_init"));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
  KVPOOL_RETURN_IF_ERROR(FromUcs(ucp_worker_create(context, &wp, &worker), "ucp_worker_create"));

  // Message headers travel in the AM header, so they are capped by what the
  // worker can carry there.
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  KVPOOL_RETURN_IF_ERROR(FromUcs(ucp_worker_query(worker, &attr), "ucp_worker_query"));
  // (An encrypted connection's headers carry the seal's trailer too.)
  if (attr.max_am_header <= kFrameBytes + kSealTrailerBytes) {
    return FailedPrecondition("UCX AM header too small");
  }
  limits.max_header_bytes = std::min(limits.max_header_bytes,
                                     attr.max_am_header - kFrameBytes - kSealTrailerBytes);

  int worker_fd = -1;
  KVPOOL_RETURN_IF_ERROR(FromUcs(ucp_worker_get_efd(worker, &worker_fd), "ucp_worker_get_efd"));
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return ErrnoStatus("epoll_create1", errno);
  sock_epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (sock_epoll_fd < 0) return ErrnoStatus("epoll_create1", errno);
  for (int fd : {worker_fd, wake_fd, sock_epoll_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) return ErrnoStatus("epoll_ctl", errno);
  }

  for (auto [id, cb] : {std::pair{kAmRequest, &OnRequestAm}, std::pair{kAmReply, &OnReplyAm}}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = cb;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    KVPOOL_RETURN_IF_ERROR(
        FromUcs(ucp_worker_set_am_recv_handler(worker, &hp), "set AM handler"));
  }

  if (!opts.registered_region.empty()) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = opts.registered_region.data();
    mp.length = opts.registered_region.size();
    KVPOOL_RETURN_IF_ERROR(FromUcs(ucp_mem_map(context, &mp, &mem), "ucp_mem_map"));
  }

  // Only network devices go in the address a peer connects to: a peer on
  // the same host must still come over the configured interface (shared
  // memory would bypass it, and any firewall rule on it).
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
  wa.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
  KVPOOL_RETURN_IF_ERROR(FromUcs(ucp_worker_query(worker, &wa), "worker address"));
  const auto* a = reinterpret_cast<const uint8_t*>(wa.address);
  worker_address.assign(a, a + wa.address_length);
  ucp_worker_release_address(worker, wa.address);
  if (worker_address.empty() || worker_address.size() > kMaxBootstrapBody) {
    return FailedPrecondition(fmt::format("UCX worker address of {} bytes (at most {})",
                                          worker_address.size(), kMaxBootstrapBody));
  }
  if (opts.listen) KVPOOL_RETURN_IF_ERROR(Listen());
  std::string host = opts.advertise_host.empty() ? opts.listen_host : opts.advertise_host;
  address = host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
  return Status::Ok();
}

void UcxTransport::Core::Loop() {
  auto last_work = SteadyClock::now();
  while (true) {
    RunSubmissions();
    // Bounded: a flood of messages cannot starve submissions and deadlines.
    int progressed = 0;
    for (int i = 0; i < 256 && ucp_worker_progress(worker) != 0; ++i) {
      ++progressed;
    }
    if (progressed > 0) last_work = SteadyClock::now();
    SubmitHandlers();
    // Sockets are looked at once a millisecond while the thread is busy, and
    // at once when their epoll set wakes a sleeping thread: accepts and
    // bootstraps are rare, and a syscall per pass would slow a busy stream.
    if (SteadyClock::now() - last_sock_poll >= std::chrono::milliseconds(1)) PollSockets();
    CloseIdleEndpoints();
    CloseFailedEndpoints();
    ReapClosing();
    FireTimers();
    RunDeferred();
    if (stopping) return;
    {
      std::lock_guard<std::mutex> lock(sub_mu);
      if (!submissions.empty()) continue;
    }
    if (!closing.empty() || !lingering.empty()) {
      // Closing endpoints need progress but raise no event; poll briefly.
      epoll_event ev;
      epoll_wait(epoll_fd, &ev, 1, 1);
      continue;
    }
    // Right after work, poll a little longer instead of sleeping: during a
    // stream of transfers the next segment arrives within microseconds, and
    // a sleep and wake-up per segment costs both this node and its peer
    // (the sender wakes this thread) more than the polling does.
    if (SteadyClock::now() - last_work < opts.progress_spin) {
      __builtin_ia32_pause();
      continue;
    }
    ucs_status_t s = ucp_worker_arm(worker);
    if (s == UCS_ERR_BUSY) continue;
    epoll_event evs[3];
    int n = epoll_wait(epoll_fd, evs, 3, NextTimeoutMs());
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == sock_epoll_fd) last_sock_poll = {};
      if (evs[i].data.fd != wake_fd) continue;
      uint64_t drained;  // one read resets the eventfd counter
      ssize_t r = read(wake_fd, &drained, sizeof(drained));
      (void)r;
    }
  }
}

int UcxTransport::Core::NextTimeoutMs() const {
  // Bootstraps in flight have deadlines of their own, checked by PollSockets.
  int cap = pending.empty() && bootstrapping.empty() ? 1000 : 100;
  if (opts.idle_close.count() > 0 && !client_eps.empty()) {
    // Wakes for the next sweep of idle connections.
    const auto to_sweep =
        std::chrono::ceil<std::chrono::milliseconds>(next_idle_sweep - SteadyClock::now());
    cap = static_cast<int>(std::clamp<int64_t>(to_sweep.count(), 0, cap));
  }
  if (timers.empty()) return cap;
  auto left = timers.begin()->first - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) return 0;
  // Round up so the thread does not wake just before the deadline and spin.
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, cap));
}

void UcxTransport::Core::RunSubmissions() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(sub_mu);
    batch.swap(submissions);
  }
  for (auto& fn : batch) fn();
}

// The requests that arrived in one pass go to the executor as one task: a
// burst of fetches costs one thread hand-off, not one each.
void UcxTransport::Core::SubmitHandlers() {
  if (to_handle.empty()) return;
  if (to_handle.size() == 1) {
    opts.handler_executor->Submit(std::move(to_handle.front()));
  } else {
    opts.handler_executor->Submit([batch = std::move(to_handle)]() mutable {
      for (auto& fn : batch) fn();
    });
  }
  to_handle.clear();
}

void UcxTransport::Core::RunDeferred() {
  while (!deferred.empty()) {
    std::vector<std::function<void()>> batch;
    batch.swap(deferred);
    for (auto& fn : batch) fn();
  }
}

void UcxTransport::Core::FireTimers() {
  auto now = SteadyClock::now();
  while (!timers.empty() && timers.begin()->first <= now) {
    uint64_t id = timers.begin()->second;
    timers.erase(timers.begin());
    auto it = calls.find(id);
    if (it == calls.end()) continue;
    const uint64_t ep_id = it->second.ep_id;
    const bool answered = it->second.answered;
    const SteadyClock::time_point sent = it->second.start;
    Settle(id, Reply{DeadlineExceeded("call timed out"), {}, 0, {}});
    it = calls.find(id);
    if (it != calls.end()) {
      // A payload still moves through the caller's memory: abort it by closing
      // the endpoint; the callback runs once UCX has let go of the memory.
      FailEndpoint(ep_id, DeadlineExceeded("transfer passed its deadline"));
    } else if (auto e = endpoints.find(ep_id); !answered && e != endpoints.end()) {
      RetireIfSilent(e->second.get(), sent);
    }
  }
}

void UcxTransport::Core::RetireIfSilent(Endpoint* e, SteadyClock::time_point sent) {
  if (!e->client || e->failed || e->retired || e->last_reply >= sent) return;
  e->retired = true;
  auto c = client_eps.find(e->peer);
  if (c != client_eps.end() && c->second == e->id) client_eps.erase(c);
  if (e->calls.empty()) CloseRetired(e);
}

void UcxTransport::Core::CloseRetired(Endpoint* e) {
  silent_closed->Inc();
  FailEndpoint(e->id, Unavailable("no reply within a call's deadline"));
}

void UcxTransport::Core::Revive(Endpoint* e) {
  if (!e->retired || e->failed || client_eps.count(e->peer) != 0) return;
  e->retired = false;
  client_eps[e->peer] = e->id;
}

UcxTransport::Core::Endpoint* UcxTransport::Core::NewEndpoint(std::string peer, bool client) {
  auto e = std::make_unique<Endpoint>();
  e->core = this;
  e->id = next_ep_id++;
  e->peer = std::move(peer);
  e->client = client;
  Endpoint* raw = e.get();
  endpoints.emplace(raw->id, std::move(e));
  return raw;
}

void UcxTransport::Core::FailEndpoint(uint64_t ep_id, const Status& why) {
  auto it = endpoints.find(ep_id);
  if (it == endpoints.end() || it->second->failed) return;
  Endpoint* e = it->second.get();
  e->failed = true;
  auto c = client_eps.find(e->peer);
  if (c != client_eps.end() && c->second == ep_id) client_eps.erase(c);
  // Closing the bootstrap socket tells the other side at once.
  if (e->fd >= 0) {
    epoll_ctl(sock_epoll_fd, EPOLL_CTL_DEL, e->fd, nullptr);
    ep_by_fd.erase(e->fd);
    close(e->fd);
    e->fd = -1;
  }
  if (e->token != 0 && !e->client) ep_by_token.erase(e->token);
  bootstrapping.erase(ep_id);
  e->waiting.clear();
  std::vector<uint64_t> ids(e->calls.begin(), e->calls.end());
  // A refusal of credentials stays PermissionDenied; anything else is a
  // connection that failed.
  bool denied = why.code() == StatusCode::kPermissionDenied;
  for (uint64_t id : ids) {
    Settle(id, Reply{denied ? why : Unavailable(why.message()), {}, 0, {}});
  }
  to_close.push_back(ep_id);
}

void UcxTransport::Core::CloseFailedEndpoints() {
  for (uint64_t id : to_close) {
    auto it = endpoints.find(id);
    if (it == endpoints.end()) continue;
    std::unique_ptr<Endpoint> e = std::move(it->second);
    endpoints.erase(it);
    endpoints_gauge->Add(-1);
    // A server endpoint owns no UCX endpoint; a client one may have none yet.
    if (e->ep == nullptr) continue;
    // The listener must see the bootstrap socket close (done in FailEndpoint)
    // before UCX tears down its reply endpoint, so the UCX endpoint closes a
    // little later; at once when a transfer still holds a caller's memory
    // (its call waits for the close) or the transport stops.
    auto due =
        stopping || !e->calls.empty() ? SteadyClock::now() : SteadyClock::now() + kCloseLinger;
    lingering.emplace_back(due, std::move(e));
  }
  to_close.clear();
  CloseLingering(/*all=*/stopping);
}

void UcxTransport::Core::CloseLingering(bool all) {
  auto now = SteadyClock::now();
  for (size_t i = 0; i < lingering.size();) {
    if (!all && lingering[i].first > now) {
      ++i;
      continue;
    }
    std::unique_ptr<Endpoint> e = std::move(lingering[i].second);
    lingering[i] = std::move(lingering.back());
    lingering.pop_back();
    // UCX may have matched this endpoint with the one a peer's connection
    // arrived on: that connection can no longer be answered, so it is
    // closed too, and the peer, seeing its bootstrap socket close, drops its
    // side and connects afresh on its next call (left open, the peer's
    // calls on it would wait out their deadlines).
    for (auto& [id, other] : endpoints) {
      if (other->reply_ep != e->ep) continue;
      other->reply_ep = nullptr;
      FailEndpoint(id, Unavailable("the UCX endpoint its replies went out on closed"));
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // the peer is gone or misbehaving: no flush
    ucs_status_ptr_t req = ucp_ep_close_nbx(e->ep, &p);
    if (UCS_PTR_IS_PTR(req)) closing.emplace_back(req, std::move(e));
  }
}

void UcxTransport::Core::ReapClosing() {
  for (size_t i = 0; i < closing.size();) {
    if (ucp_request_check_status(closing[i].first) != UCS_INPROGRESS) {
      ucp_request_free(closing[i].first);
      closing[i] = std::move(closing.back());
      closing.pop_back();
    } else {
      ++i;
    }
  }
}

void UcxTransport::Core::StartCall(uint64_t id, std::string peer, Result<sockaddr_storage> addr,
                                   std::vector<uint8_t> am_header,
                                   std::span<const uint8_t> payload, std::span<uint8_t> sink,
                                   Deadline deadline, ReplyCallback done) {
  CallState& c = calls[id];
  c.done = std::move(done);
  c.sink = sink;
  c.start = SteadyClock::now();
  timers.emplace(deadline, id);
  if (stopping) return Settle(id, Reply{Unavailable("transport shut down"), {}, 0, {}});
  if (!addr.ok()) return Settle(id, Reply{addr.status(), {}, 0, {}});
  if (SteadyClock::now() >= deadline) {
    return Settle(id, Reply{DeadlineExceeded("deadline passed before sending"), {}, 0, {}});
  }
  Result<uint64_t> ep_id = ClientEndpoint(peer, *addr);
  if (!ep_id.ok()) return Settle(id, Reply{Unavailable(ep_id.status().message()), {}, 0, {}});
  c.ep_id = *ep_id;
  Endpoint* e = endpoints[*ep_id].get();
  e->calls.insert(id);
  e->last_used = SteadyClock::now();
  if (e->ready) return SendRequest(id, *ep_id, std::move(am_header), payload);
  // Held until the bootstrap is done; dropped with the endpoint if it fails
  // (which settles the call), and a call settled meanwhile sends nothing.
  e->waiting.push_back([this, id, ep = *ep_id, am_header = std::move(am_header), payload]() mutable {
    auto it = calls.find(id);
    if (it == calls.end() || it->second.verdict) return;
    SendRequest(id, ep, std::move(am_header), payload);
  });
}

void UcxTransport::Core::SendRequest(uint64_t id, uint64_t ep_id, std::vector<uint8_t> am_header,
                                     std::span<const uint8_t> payload) {
  CallState& c = calls[id];
  Endpoint* e = endpoints[ep_id].get();
  SetFrameConn(&am_header, e->token);
  // Sealed, the payload is copied out of the caller's memory at once.
  SealBuffers::Buffer sealed;
  if (e->seal != nullptr) {
    Status st = SealOutgoing(e, &am_header, &payload, &sealed);
    if (!st.ok()) return Settle(id, Reply{st, {}, 0, {}});
  }
  auto* op = new SendOp{this, std::move(am_header), id, !payload.empty() && e->seal == nullptr,
                        nullptr, 0, std::move(sealed)};
  op->bytes = op->am_header.size() + payload.size();
  if (op->holds_ref) ++c.refs;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the listener answers on its reply endpoint
  p.cb.send = &OnSend;
  p.user_data = op;
  ucs_status_ptr_t sp = ucp_am_send_nbx(e->ep, kAmRequest, op->am_header.data(),
                                        op->am_header.size(), payload.data(), payload.size(), &p);
  if (UCS_PTR_IS_PTR(sp)) {
    live_sends.insert(op);
  } else {
    SendDone(op, UCS_PTR_STATUS(sp));
  }
}

void UcxTransport::Core::SendDone(SendOp* op, ucs_status_t status) {
  if (status == UCS_OK) bytes_sent->Inc(op->bytes);
  if (op->call_id != 0) {
    auto it = calls.find(op->call_id);
    if (it != calls.end()) {
      if (op->holds_ref) --it->second.refs;
      if (status != UCS_OK) {
        Settle(op->call_id,
               Reply{Unavailable(FromUcs(status, "send request").message()), {}, 0, {}});
      }
      MaybeFinish(op->call_id);
    }
  }
  if (op->release) deferred.push_back(std::move(op->release));
  seal_buffers.Give(std::move(op->sealed));
  delete op;
}

void UcxTransport::Core::SendReply(uint64_t ep_id, uint64_t request_id, MessageType type,
                                   Deadline deadline, ServerReply r) {
  auto it = endpoints.find(ep_id);
  Endpoint* e = it != endpoints.end() ? it->second.get() : nullptr;
  if (e != nullptr) {
    if (e->in_service > 0) --e->in_service;
    e->last_request = SteadyClock::now();
  }
  // The reply endpoint is UCX's: it is destroyed once its connection fails,
  // which the connector announces by closing the bootstrap socket first (a
  // connector closes its UCX endpoint only after that socket, see
  // CloseFailedEndpoints). So it is used only while that socket is open, and
  // not for an answer past the caller's deadline, which nobody waits for.
  bool usable = !stopping && e != nullptr && !e->failed && e->reply_ep != nullptr;
  if (usable && !SocketOpen(e->fd)) {
    FailEndpoint(ep_id, Unavailable("peer connection closed"));
    usable = false;
  }
  if (usable && SteadyClock::now() > deadline) {
    CountError("reply_after_deadline");
    usable = false;
  }
  if (!usable) {
    if (r.release) deferred.push_back(std::move(r.release));
    return;
  }
  if (r.status.ok() && (r.header.size() > limits.max_header_bytes ||
                        r.payload.size() > limits.max_payload_bytes)) {
    r.status = Internal("reply over the size limits");
  }
  std::span<const uint8_t> payload = r.status.ok() ? r.payload : std::span<const uint8_t>();
  std::vector<uint8_t> error_text;
  if (!r.status.ok()) {
    std::string_view m = r.status.message().substr(0, limits.max_header_bytes);
    error_text.assign(m.begin(), m.end());
  }
  Frame f;
  f.kind = FrameKind::kReply;
  f.type = type;
  f.request_id = request_id;
  f.status = static_cast<int32_t>(r.status.code());
  f.payload_len = payload.size();
  std::vector<uint8_t> am_header = EncodeFrame(f, r.status.ok() ? r.header : error_text);
  SealBuffers::Buffer sealed;
  if (e->seal != nullptr) {
    Status st = SealOutgoing(e, &am_header, &payload, &sealed);
    // The handler's memory is no longer needed once sealed (or not sent).
    if (r.release) deferred.push_back(std::move(r.release));
    r.release = nullptr;
    if (!st.ok()) {
      CountError("seal_failed");
      return FailEndpoint(ep_id, st);
    }
  }
  auto* op = new SendOp{this, std::move(am_header), 0, false, std::move(r.release), 0,
                        std::move(sealed)};
  op->bytes = op->am_header.size() + payload.size();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnSend;
  p.user_data = op;
  ucs_status_ptr_t sp = ucp_am_send_nbx(e->reply_ep, kAmReply, op->am_header.data(),
                                        op->am_header.size(), payload.data(), payload.size(), &p);
  if (UCS_PTR_IS_PTR(sp)) {
    live_sends.insert(op);
  } else {
    SendDone(op, UCS_PTR_STATUS(sp));
  }
}

Status UcxTransport::Core::SealOutgoing(Endpoint* e, std::vector<uint8_t>* am_header,
                                        std::span<const uint8_t>* payload,
                                        SealBuffers::Buffer* sealed) {
  if (!payload->empty()) *sealed = seal_buffers.Take(payload->size());
  KVPOOL_RETURN_IF_ERROR(e->seal->Seal(am_header, *payload, sealed->data.get()));
  *payload = {sealed->data.get(), payload->size()};
  return Status::Ok();
}

bool UcxTransport::Core::CheckIncoming(const Endpoint& e, std::span<const uint8_t> hdr,
                                       const char** reason) const {
  if (e.seal != nullptr) return e.seal->Plausible(hdr, reason);
  if (hdr.size() > limits.max_header_bytes) {
    *reason = "header_too_large";
    return false;
  }
  return true;
}

void UcxTransport::Core::Settle(uint64_t id, Reply verdict) {
  auto it = calls.find(id);
  if (it == calls.end() || it->second.verdict) return;
  it->second.verdict = std::move(verdict);
  MaybeFinish(id);
}

void UcxTransport::Core::MaybeFinish(uint64_t id) {
  auto it = calls.find(id);
  if (it == calls.end()) return;
  CallState& c = it->second;
  if (!c.verdict || c.refs > 0) return;
  Reply reply = std::move(*c.verdict);
  if (c.answered && reply.status.code() != StatusCode::kDeadlineExceeded &&
      reply.status.code() != StatusCode::kUnavailable) {
    calls_ok->Inc();
  } else if (reply.status.code() == StatusCode::kDeadlineExceeded) {
    calls_timeout->Inc();
  } else if (reply.status.code() == StatusCode::kUnavailable) {
    calls_unavailable->Inc();
  } else {
    calls_error->Inc();
  }
  latency->Observe(std::chrono::duration<double>(SteadyClock::now() - c.start).count());
  auto e = endpoints.find(c.ep_id);
  if (e != endpoints.end()) {
    Endpoint* ep = e->second.get();
    ep->calls.erase(id);
    ep->last_used = SteadyClock::now();
    if (ep->retired && !ep->failed && ep->calls.empty()) CloseRetired(ep);
  }
  ReplyCallback done = std::move(c.done);
  calls.erase(it);
  deferred.push_back([done = std::move(done), reply = std::move(reply)]() mutable {
    done(std::move(reply));
  });
}

ucs_status_t UcxTransport::Core::OnRequest(const void* header, size_t header_len, void* data,
                                           size_t len, const ucp_am_recv_param_t* param) {
  Frame f;
  std::span<const uint8_t> hdr;
  const char* reason = "";
  Status st = DecodeIncoming(header, header_len, len, FrameKind::kRequest, &f, &hdr, &reason);
  // A request belongs to the connection whose token it carries; one with no
  // live token came from no bootstrap this node finished (or one it has
  // closed) and has nowhere to be answered.
  auto tok = st.ok() ? ep_by_token.find(f.conn) : ep_by_token.end();
  if (st.ok() && tok == ep_by_token.end()) {
    CountError("unknown_connection");
    return UCS_OK;
  }
  if (!st.ok()) {
    // A peer that sends garbage is cut off: the connection its frame names,
    // when the header is long enough to name one. UCX drops a rendezvous we
    // decline.
    CountError(reason);
    if (header_len >= kFrameBytes) {
      const auto* h = static_cast<const uint8_t*>(header) + 36;
      uint32_t conn = h[0] | (h[1] << 8) | (h[2] << 16) | (uint32_t{h[3]} << 24);
      auto it = ep_by_token.find(conn);
      if (it != ep_by_token.end()) FailEndpoint(it->second, st);
    }
    return UCS_OK;
  }
  std::optional<uint64_t> ep_id = tok->second;
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    CountError("no_reply_endpoint");
    FailEndpoint(*ep_id, InvalidArgument("request without a reply endpoint"));
    return UCS_OK;
  }
  Endpoint* e = endpoints[*ep_id].get();
  if (!CheckIncoming(*e, hdr, &reason)) {
    CountError(reason);
    FailEndpoint(*ep_id, InvalidArgument(fmt::format("bad request ({})", reason)));
    return UCS_OK;
  }
  e->reply_ep = param->reply_ep;
  e->last_request = SteadyClock::now();
  bytes_received->Inc(header_len + len);
  const auto* am = static_cast<const uint8_t*>(header);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    auto* op = new RecvOp{this, true, 0, *ep_id, f, {hdr.begin(), hdr.end()}, {}, {}};
    if (e->seal != nullptr) op->sealed.assign(am, am + header_len);
    op->payload.resize(len);  // len was checked against the limit above
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &OnRecv;
    p.user_data = op;
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(worker, data, op->payload.data(), len, &p);
    if (UCS_PTR_IS_PTR(sp)) {
      live_recvs.insert(op);
    } else {
      RecvDone(op, UCS_PTR_STATUS(sp));
    }
    return UCS_INPROGRESS;
  }
  const auto* d = static_cast<const uint8_t*>(data);
  if (e->seal != nullptr) {
    std::vector<uint8_t> plain_header, payload(len);
    if (!e->seal->Open({am, kFrameBytes}, hdr, &plain_header, d, payload.data(), len, &reason)
             .ok()) {
      CountError(reason);
      FailEndpoint(*ep_id, Unavailable("a request failed its integrity check"));
      return UCS_OK;
    }
    Dispatch(*ep_id, f, std::move(plain_header), std::move(payload));
    return UCS_OK;
  }
  Dispatch(*ep_id, f, {hdr.begin(), hdr.end()}, std::vector<uint8_t>(d, d + len));
  return UCS_OK;
}

void UcxTransport::Core::Dispatch(uint64_t ep_id, Frame frame, std::vector<uint8_t> header,
                                  std::vector<uint8_t> payload) {
  Deadline deadline = SteadyClock::now() + std::chrono::milliseconds(frame.budget_ms);
  // Every request dispatched is answered through SendReply once.
  if (auto served = endpoints.find(ep_id); served != endpoints.end()) ++served->second->in_service;
  Handler handler;
  {
    std::lock_guard<std::mutex> lock(handlers_mu);
    auto h = handlers.find(frame.type);
    if (h != handlers.end()) handler = h->second;
  }
  if (!handler) {
    SendReply(ep_id, frame.request_id, frame.type, deadline,
              ServerReply{InvalidArgument("no handler for message type"), {}, {}, nullptr});
    return;
  }
  auto it = endpoints.find(ep_id);
  std::string peer = it != endpoints.end() ? it->second->peer : "unknown";
  std::string principal = it != endpoints.end() ? it->second->principal : "";
  if (!principal.empty() &&
      std::find(opts.client_message_types.begin(), opts.client_message_types.end(), frame.type) ==
          opts.client_message_types.end()) {
    CountError("client_message_refused");
    SendReply(ep_id, frame.request_id, frame.type, deadline,
              ServerReply{PermissionDenied("clients may not send this message type"), {}, {},
                          nullptr});
    return;
  }
  std::weak_ptr<Core> weak = weak_from_this();
  auto responder = std::make_shared<Responder>(
      [weak, ep_id, id = frame.request_id, type = frame.type, deadline](ServerReply r) {
        auto core = weak.lock();
        auto release = r.release;
        auto shared = std::make_shared<ServerReply>(std::move(r));
        if (core == nullptr ||
            !core->Submit([c = core.get(), ep_id, id, type, deadline, shared] {
              c->SendReply(ep_id, id, type, deadline, std::move(*shared));
            })) {
          if (release) release();
        }
      });
  auto run = [handler = std::move(handler), peer = std::move(peer), type = frame.type,
              header = std::move(header), payload = std::move(payload), deadline, responder,
              principal = std::move(principal)]() mutable {
    handler(Incoming{peer, type, header, payload, deadline, principal}, std::move(*responder));
  };
  if (opts.handler_executor != nullptr) {
    to_handle.push_back(std::move(run));
    if (to_handle.size() >= opts.max_handler_batch) SubmitHandlers();
  } else {
    deferred.push_back(std::move(run));
  }
}

Status UcxTransport::Core::DecodeIncoming(const void* header, size_t header_len, size_t len,
                                          FrameKind want, Frame* f, std::span<const uint8_t>* hdr,
                                          const char** reason) const {
  // The header limit is checked again once the connection is known
  // (CheckIncoming): only an encrypted one carries the seal's trailer.
  Status st = DecodeFrame({static_cast<const uint8_t*>(header), header_len}, len,
                          limits.max_header_bytes + kSealTrailerBytes, limits.max_payload_bytes, f,
                          hdr, reason);
  if (st.ok() && f->kind != want) st = InvalidArgument(*reason = "bad_kind");
  return st;
}

ucs_status_t UcxTransport::Core::OnReply(const void* header, size_t header_len, void* data,
                                         size_t len, const ucp_am_recv_param_t* param) {
  Frame f;
  std::span<const uint8_t> hdr;
  const char* reason = "";
  Status st = DecodeIncoming(header, header_len, len, FrameKind::kReply, &f, &hdr, &reason);
  if (!st.ok()) {
    CountError(reason);
    return UCS_OK;
  }
  bytes_received->Inc(header_len + len);
  auto it = calls.find(f.request_id);
  if (it == calls.end() || it->second.verdict) return UCS_OK;  // late: dropped
  CallState& c = it->second;
  auto ep = endpoints.find(c.ep_id);
  if (ep == endpoints.end()) return UCS_OK;  // its connection is closing: dropped
  Endpoint* e = ep->second.get();
  e->last_reply = SteadyClock::now();
  Revive(e);
  // A reply that fails its checks ends its call and its connection.
  auto reject = [&](const char* why) {
    CountError(why);
    Settle(f.request_id, Reply{Unavailable(fmt::format("bad reply from {} ({})", e->peer, why)),
                               {}, 0, {}});
    FailEndpoint(e->id, Unavailable("a reply failed its checks"));
    return UCS_OK;
  };
  if (!CheckIncoming(*e, hdr, &reason)) {
    if (e->seal != nullptr) return reject(reason);
    CountError(reason);  // as any malformed reply: dropped
    return UCS_OK;
  }
  const auto* am = static_cast<const uint8_t*>(header);
  std::vector<uint8_t> opened;  // an encrypted error reply's text
  if (e->seal != nullptr && f.status != 0) {
    if (!e->seal->Open({am, kFrameBytes}, hdr, &opened, nullptr, nullptr, 0, &reason).ok()) {
      return reject(reason);
    }
    hdr = opened;
  }
  c.answered = true;
  if (f.status != 0) {
    auto code = IsErrorStatusCode(f.status)
                    ? static_cast<StatusCode>(f.status)
                    : StatusCode::kInternal;
    Settle(f.request_id, Reply{Status(code, AsString(hdr)), {}, 0, {}});
    return UCS_OK;
  }
  c.partial.header.assign(hdr.begin(), hdr.end());
  uint8_t* dst = nullptr;
  if (c.sink.data() != nullptr) {
    if (len > c.sink.size()) {
      Settle(f.request_id,
             Reply{ResourceExhausted(fmt::format("reply payload of {} bytes exceeds the {}-byte sink",
                                                 len, c.sink.size())),
                   {}, 0, {}});
      return UCS_OK;
    }
    dst = c.sink.data();
  } else {
    c.partial.payload.resize(len);
    dst = c.partial.payload.data();
  }
  c.partial.payload_bytes = len;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    auto* op = new RecvOp{this, false, f.request_id, 0, f, {}, {}, {}};
    if (e->seal != nullptr) op->sealed.assign(am, am + header_len);
    ++c.refs;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &OnRecv;
    p.user_data = op;
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(worker, data, dst, len, &p);
    if (UCS_PTR_IS_PTR(sp)) {
      live_recvs.insert(op);
    } else {
      RecvDone(op, UCS_PTR_STATUS(sp));
    }
    return UCS_INPROGRESS;
  }
  if (e->seal != nullptr) {
    std::span<const uint8_t> sealed_header = hdr;
    if (!e->seal->Open({am, kFrameBytes}, sealed_header, &c.partial.header,
                       static_cast<const uint8_t*>(data), dst, len, &reason)
             .ok()) {
      return reject(reason);
    }
  } else if (len > 0) {
    std::memcpy(dst, data, len);
  }
  Settle(f.request_id, std::move(c.partial));
  return UCS_OK;
}

void UcxTransport::Core::RecvDone(RecvOp* op, ucs_status_t status) {
  // An encrypted message is opened once its payload has landed.
  auto open = [&](Endpoint* e, std::vector<uint8_t>* header_out, uint8_t* payload, size_t len) {
    if (op->sealed.empty()) return true;
    const char* reason = "";
    std::span<const uint8_t> am(op->sealed);
    if (e != nullptr && e->seal != nullptr &&
        e->seal->Open(am.first(kFrameBytes), am.subspan(kFrameBytes), header_out, payload, payload,
                      len, &reason)
            .ok()) {
      return true;
    }
    CountError(*reason ? reason : "bad_seal");
    if (e != nullptr) FailEndpoint(e->id, Unavailable("a message failed its integrity check"));
    return false;
  };
  auto endpoint = [&](uint64_t id) -> Endpoint* {
    auto it = endpoints.find(id);
    return it == endpoints.end() ? nullptr : it->second.get();
  };
  if (op->is_request) {
    if (status != UCS_OK) {
      CountError("payload_receive_failed");
    } else if (open(endpoint(op->ep_id), &op->header, op->payload.data(), op->payload.size())) {
      Dispatch(op->ep_id, op->frame, std::move(op->header), std::move(op->payload));
    }
  } else {
    auto it = calls.find(op->call_id);
    if (it != calls.end()) {
      --it->second.refs;
      CallState& c = it->second;
      uint8_t* dst = c.sink.data() != nullptr ? c.sink.data() : c.partial.payload.data();
      if (status == UCS_OK && !open(endpoint(c.ep_id), &c.partial.header, dst,
                                    c.partial.payload_bytes)) {
        Settle(op->call_id, Reply{Unavailable("a reply failed its integrity check"), {}, 0, {}});
      } else if (status == UCS_OK) {
        Settle(op->call_id, std::move(it->second.partial));
      } else {
        Settle(op->call_id,
               Reply{Unavailable(FromUcs(status, "receive reply payload").message()), {}, 0, {}});
      }
      MaybeFinish(op->call_id);
    }
  }
  delete op;
}

void UcxTransport::Core::Shutdown() {
  RunSubmissions();  // calls submitted before the stop fail; replies are dropped
  to_handle.clear();  // their responders answer Internal, which is dropped
  if (listen_fd >= 0) close(listen_fd);
  listen_fd = -1;
  while (!pending.empty()) ClosePending(pending.begin()->first);
  std::vector<uint64_t> ids;
  for (auto& [id, c] : calls) ids.push_back(id);
  const size_t calls_in_flight = ids.size();
  for (uint64_t id : ids) Settle(id, Reply{Unavailable("transport shut down"), {}, 0, {}});
  std::vector<uint64_t> eps;
  for (auto& [id, e] : endpoints) eps.push_back(id);
  for (uint64_t id : eps) FailEndpoint(id, Unavailable("transport shut down"));
  CloseFailedEndpoints();
  CloseLingering(/*all=*/true);
  auto until = SteadyClock::now() + opts.close_timeout;
  while ((!closing.empty() || !calls.empty()) && SteadyClock::now() < until) {
    ucp_worker_progress(worker);
    CloseFailedEndpoints();
    ReapClosing();
    RunDeferred();
  }
  const size_t unclosed = closing.size();
  for (auto& [req, e] : closing) ucp_request_free(req);
  closing.clear();
  // Destroying the worker purges what its endpoints still queue. UCX before
  // 1.14 aborts the process (an assertion in ucp_request_send_state_ff,
  // removed upstream in 1.14) when that is a wire-up message, which happens
  // when a peer stopped reading (hung, its socket full) while this node sent
  // to it. Calls still in flight at the stop, or endpoints that did not
  // close, are the sign of such a peer: then the worker and its context are
  // left as they are. Nothing progresses them any more, so UCX writes
  // nowhere, and the process's exit takes back their memory and sockets.
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  const bool purge_may_abort = major < 1 || (major == 1 && minor < 14);
  if (purge_may_abort && (calls_in_flight > 0 || unclosed > 0)) {
    LogWarn(
        "transport: stopped with {} call(s) in flight and {} endpoint(s) not closed in {} ms; "
        "leaving the UCX {}.{} worker to the process exit",
        calls_in_flight, unclosed, opts.close_timeout.count(), major, minor);
  } else {
    if (mem != nullptr) ucp_mem_unmap(context, mem);
    // After the worker is gone UCX writes nowhere, so calls whose transfers
    // never finished can be answered and their operations freed.
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
  worker = nullptr;
  context = nullptr;
  for (auto& [id, c] : calls) {
    c.refs = 0;
    if (!c.verdict) c.verdict = Reply{Unavailable("transport shut down"), {}, 0, {}};
    ids.push_back(id);
  }
  for (uint64_t id : ids) MaybeFinish(id);
  for (SendOp* op : live_sends) {
    if (op->release) deferred.push_back(std::move(op->release));
    delete op;
  }
  for (RecvOp* op : live_recvs) delete op;
  live_sends.clear();
  live_recvs.clear();
  RunDeferred();
  endpoints.clear();
  if (epoll_fd >= 0) close(epoll_fd);
  if (sock_epoll_fd >= 0) close(sock_epoll_fd);
}

}  // namespace kvpool::transport
