// The peer port and the bootstrap sockets of the UCX transport: kvpool's own
// TCP listener, the hello/welcome exchange (bootstrap_format.h) that trades
// UCX worker addresses, and the silent TCP connection kept beside each UCX
// endpoint. Everything here runs on the progress thread.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/epoll.h>

#include <cstring>
#include <random>

#include "common/log.h"
#include "transport/ucx_core.h"

namespace kvpool::transport {

namespace {

bool IsWildcard(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    return IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr);
  }
  return reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr == htonl(INADDR_ANY);
}

bool SameHost(const sockaddr_storage& want, const sockaddr* have) {
  if (have == nullptr || have->sa_family != want.ss_family) return false;
  if (want.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&want)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(have)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return reinterpret_cast<const sockaddr_in*>(&want)->sin_addr.s_addr ==
         reinterpret_cast<const sockaddr_in*>(have)->sin_addr.s_addr;
}

bool IsLoopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr);
  }
  return (ntohl(reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
}

// Writes what it can without blocking; false when the socket failed.
bool WriteSome(int fd, std::vector<uint8_t>* out) {
  while (!out->empty()) {
    ssize_t n = send(fd, out->data(), out->size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    out->erase(out->begin(), out->begin() + n);
  }
  return true;
}

}  // namespace

Result<std::string> NetDevices(const UcxTransportOptions& o) {
  if (!o.net_devices.empty()) return o.net_devices;
  if (!o.listen) return std::string();
  KVPOOL_ASSIGN_OR_RETURN(sockaddr_storage want, Resolve(o.listen_host, 0));
  if (IsWildcard(want)) return std::string();
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return ErrnoStatus("getifaddrs", errno);
  std::string exact, loopback;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (SameHost(want, i->ifa_addr) && exact.empty()) exact = i->ifa_name;
    if ((i->ifa_flags & IFF_LOOPBACK) && loopback.empty()) loopback = i->ifa_name;
  }
  freeifaddrs(list);
  if (!exact.empty()) return exact;
  // Every 127.x address is bindable on the loopback interface, though only
  // 127.0.0.1 is listed on it.
  if (IsLoopback(want) && !loopback.empty()) return loopback;
  return FailedPrecondition(fmt::format(
      "no network interface holds peer address {} (give one this host has, or the UCX "
      "network devices explicitly)",
      o.listen_host));
}

Status UcxTransport::Core::WatchFd(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(sock_epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) return ErrnoStatus("epoll_ctl", errno);
  return Status::Ok();
}

uint32_t UcxTransport::Core::NewToken() {
  if (rng_state == 0) rng_state = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  while (true) {
    // splitmix64: tokens name connections; they are not secrets.
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    auto t = static_cast<uint32_t>(z ^ (z >> 31));
    if (t != 0 && !ep_by_token.contains(t)) return t;
  }
}

Status UcxTransport::Core::Listen() {
  KVPOOL_ASSIGN_OR_RETURN(sockaddr_storage addr, Resolve(opts.listen_host, opts.listen_port));
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("peer port socket", errno);
  // A restarted node takes its port back while the old connections linger
  // in TIME_WAIT.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), AddrLen(addr)) != 0 ||
      listen(fd, 1024) != 0) {
    int err = errno;
    close(fd);
    return Unavailable(fmt::format("peer port {}: {}", FormatAddr(addr), std::strerror(err)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listen_fd = fd;
  return WatchFd(fd, EPOLLIN);
}

void UcxTransport::Core::PollSockets() {
  last_sock_poll = SteadyClock::now();
  bool accepted = false;  // once per pass (the listener stays ready while more wait)
  epoll_event evs[64];
  for (int round = 0; round < 16; ++round) {
    int n = epoll_wait(sock_epoll_fd, evs, 64, 0);
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == listen_fd) {
        if (!accepted) Accept();
        accepted = true;
      } else if (pending.contains(fd)) {
        OnPendingReadable(fd);
      } else if (auto it = ep_by_fd.find(fd); it != ep_by_fd.end()) {
        OnEndpointSocket(it->second, evs[i].events);
      }
    }
    if (n < 64) break;
  }
  ExpireBootstraps();
}

void UcxTransport::Core::Accept() {
  // A few per pass: a flood of connections is taken in slices between UCX
  // progress passes, so established connections keep their latency.
  for (int i = 0; i < 16; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) CountRefused("no_file_descriptors");
      return;
    }
    if (stopping || pending.size() >= opts.max_bootstrapping) {
      Refuse(fd, "too_many_bootstrapping", "too many connections in their bootstrap");
      continue;
    }
    if (endpoints.size() >= opts.max_endpoints) {
      Refuse(fd, "too_many_endpoints", "too many peer connections");
      continue;
    }
    if (!WatchFd(fd, EPOLLIN | EPOLLRDHUP).ok()) {
      close(fd);
      continue;
    }
    pending.emplace(
        fd, Pending{SteadyClock::now() + opts.bootstrap_timeout, FormatAddr(ss), {}, nullptr});
    bootstrapping_gauge->Set(static_cast<int64_t>(pending.size()));
  }
}

void UcxTransport::Core::Refuse(int fd, const char* reason, std::string_view message) {
  CountRefused(reason);
  BootstrapMessage m;
  m.kind = BootstrapKind::kRefuse;
  m.body.assign(message.begin(), message.end());
  std::vector<uint8_t> out = EncodeBootstrap(m);
  WriteSome(fd, &out);  // best effort: the connection closes either way
  close(fd);
}

void UcxTransport::Core::ClosePending(int fd) {
  epoll_ctl(sock_epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  pending.erase(fd);
  bootstrapping_gauge->Set(static_cast<int64_t>(pending.size()));
}

void UcxTransport::Core::OnPendingReadable(int fd) {
  Pending& p = pending.at(fd);
  // Never more than one hello's worth of bytes (the largest message a
  // connector sends: a proof is smaller) is read from a connection that
  // has not been welcomed.
  uint8_t buf[kBootstrapHeaderBytes + kMaxHelloBody];
  ssize_t n = recv(fd, buf, sizeof(buf) - p.in.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    CountRefused(n == 0 ? "closed_in_bootstrap" : "socket_error");
    return ClosePending(fd);
  }
  p.in.insert(p.in.end(), buf, buf + n);
  BootstrapMessage m;
  size_t used = 0;
  const char* reason = "";
  BootstrapParse r = ParseBootstrap(p.in, &m, &used, &reason);
  if (r == BootstrapParse::kNeedMore) return;
  // A hello first; after a challenge, its proof.
  BootstrapKind want = p.auth ? BootstrapKind::kProof : BootstrapKind::kHello;
  if (r == BootstrapParse::kDone && m.kind != want) reason = "unexpected_kind";
  // Nothing may follow a hello or a proof before the answer.
  if (r == BootstrapParse::kDone && used != p.in.size()) reason = "trailing_bytes";
  if (*reason == '\0' && m.kind == BootstrapKind::kHello) return OnHello(fd, &p, std::move(m));
  std::string peer = p.peer;
  Status proven = Status::Ok();
  if (*reason == '\0') proven = p.auth->Verify(m.body, &reason);
  if (proven.ok() && *reason == '\0' && p.auth) {
    LogDebug("transport: peer {} at {} authenticated", p.auth->peer_identity(), peer);
    authenticated_listener->Inc();
  }
  epoll_ctl(sock_epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  Pending taken = std::move(p);
  pending.erase(fd);
  bootstrapping_gauge->Set(static_cast<int64_t>(pending.size()));
  if (!proven.ok()) return RefuseAuth(fd, peer, reason, "authentication failed");
  if (std::string_view(reason) == "bad_version") {
    // A node of another kvpool version: said on both sides (a node that
    // cannot read this refusal reports the version mismatch itself).
    const std::string why = fmt::format(
        "{} speaks another version of kvpool's peer protocol (this node: bootstrap version "
        "{}); run one kvpool version across the cluster",
        peer, kBootstrapVersion);
    LogWarn("transport: refused peer: {}", why);
    return Refuse(fd, reason, why);
  }
  if (*reason != '\0') return Refuse(fd, reason, "not a kvpool peer hello");
  Welcome(fd, std::move(taken));
}

void UcxTransport::Core::OnHello(int fd, Pending* p, BootstrapMessage m) {
  auto drop = [&] {
    epoll_ctl(sock_epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    std::string peer = std::move(p->peer);
    pending.erase(fd);
    bootstrapping_gauge->Set(static_cast<int64_t>(pending.size()));
    return peer;
  };
  // Without cluster keys, members come unauthenticated (loopback or
  // --insecure); clients always authenticate, with a token.
  bool members_keyed = !opts.cluster_keys.empty();
  if (!members_keyed && m.body.empty()) {
    Pending taken = std::move(*p);
    drop();
    return Welcome(fd, std::move(taken));
  }
  if (accepted_keys.empty()) {
    std::string peer = drop();
    return RefuseAuth(fd, peer, "auth_not_configured",
                      "this node has no cluster key (--cluster-key-file)");
  }
  if (m.body.empty()) {
    std::string peer = drop();
    return RefuseAuth(fd, peer, "auth_required",
                      "this node requires cluster authentication (--cluster-key-file)");
  }
  p->auth = std::make_unique<AuthListener>(&accepted_keys, identity, opts.peer_encryption);
  const char* reason = "";
  Result<std::vector<uint8_t>> challenge = p->auth->Challenge(m.body, &reason);
  if (!challenge.ok()) {
    std::string peer = drop();
    return RefuseAuth(fd, peer, reason, challenge.status().message());
  }
  p->in.clear();
  BootstrapMessage c;
  c.kind = BootstrapKind::kChallenge;
  c.body = std::move(challenge).value();
  std::vector<uint8_t> out = EncodeBootstrap(c);
  // A challenge (a few hundred bytes) fits a new socket's send buffer; a
  // connection that cannot take it is not worth waiting for.
  if (!WriteSome(fd, &out) || !out.empty()) {
    CountRefused("socket_error");
    ClosePending(fd);
  }
}

void UcxTransport::Core::RefuseAuth(int fd, const std::string& peer, const char* reason,
                                    std::string_view why) {
  auto now = SteadyClock::now();
  if (now - auth_log_at >= std::chrono::seconds(1)) {
    LogWarn("transport: refused peer {}: {} ({}){}", peer, why, reason,
            auth_unlogged == 0 ? std::string()
                               : fmt::format("; {} more refused since the last such line",
                                             auth_unlogged));
    auth_log_at = now;
    auth_unlogged = 0;
  } else {
    ++auth_unlogged;
  }
  Refuse(fd, reason, std::string(kRefusedPermission) + std::string(why));
}

void UcxTransport::Core::Welcome(int fd, Pending p) {
  if (OpenEndpoints() >= opts.max_endpoints) {
    return Refuse(fd, "too_many_endpoints", "too many peer connections");
  }
  std::unique_ptr<PeerSeal> seal;
  if (p.auth != nullptr && p.auth->encrypted()) {
    const SessionKeys& k = p.auth->session_keys();
    Result<std::unique_ptr<PeerSeal>> made =
        PeerSeal::Make(k.listener_to_connector, k.connector_to_listener);
    if (!made.ok()) return Refuse(fd, "seal_failed", made.status().message());
    seal = std::move(made).value();
    encrypted_listener->Inc();
  }
  Endpoint* e = NewEndpoint(p.peer, /*client=*/false);
  e->fd = fd;
  e->seal = std::move(seal);
  if (p.auth != nullptr && p.auth->key() != nullptr) e->principal = p.auth->key()->principal;
  e->token = NewToken();
  e->ready = true;
  ep_by_token[e->token] = e->id;
  ep_by_fd[fd] = e->id;
  endpoints_gauge->Add(1);
  BootstrapMessage m;
  m.kind = BootstrapKind::kWelcome;
  m.token = e->token;
  m.body = worker_address;
  e->out = EncodeBootstrap(m);
  bool ok = WriteSome(fd, &e->out);
  uint32_t events = EPOLLIN | EPOLLRDHUP | (e->out.empty() ? 0u : uint32_t{EPOLLOUT});
  if (!ok || !WatchFd(fd, events).ok()) {
    FailEndpoint(e->id, Unavailable("peer connection closed during its bootstrap"));
  }
}

Result<ucp_ep_h> UcxTransport::Core::CreateUcpEndpoint(Endpoint* e,
                                                       std::span<const uint8_t> address) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &OnEpError;
  ep.err_handler.arg = e;
  ucp_ep_h h = nullptr;
  ucs_status_t s = ucp_ep_create(worker, &ep, &h);
  if (s != UCS_OK) return FromUcs(s, "connect to " + e->peer);
  return h;
}

Result<uint64_t> UcxTransport::Core::ClientEndpoint(const std::string& peer,
                                                    const sockaddr_storage& addr) {
  auto found = client_eps.find(peer);
  if (found != client_eps.end()) return found->second;
  if (OpenEndpoints() >= opts.max_endpoints && !CloseLeastRecentIdle()) {
    return ResourceExhausted("too many peer connections");
  }
  BootstrapMessage hello;
  std::unique_ptr<AuthConnector> auth;
  if (!opts.cluster_keys.empty()) {
    auth = std::make_unique<AuthConnector>(opts.cluster_keys.front(), identity,
                                           opts.peer_encryption);
    KVPOOL_ASSIGN_OR_RETURN(hello.body, auth->Hello());
  }
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("peer socket", errno);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), AddrLen(addr)) != 0 &&
      errno != EINPROGRESS) {
    int err = errno;
    close(fd);
    return Unavailable(fmt::format("connect to {}: {}", peer, std::strerror(err)));
  }
  Status watched = WatchFd(fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  if (!watched.ok()) {
    close(fd);
    return watched;
  }
  Endpoint* e = NewEndpoint(peer, /*client=*/true);
  e->fd = fd;
  e->bootstrap_deadline = SteadyClock::now() + opts.bootstrap_timeout;
  e->auth = std::move(auth);
  e->out = EncodeBootstrap(hello);
  ep_by_fd[fd] = e->id;
  client_eps[peer] = e->id;
  bootstrapping.insert(e->id);
  endpoints_gauge->Add(1);
  last_sock_poll = {};  // the connect may finish within the next pass
  return e->id;
}

bool UcxTransport::Core::SocketOpen(int fd) const {
  uint8_t b;
  ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

bool UcxTransport::Core::FlushOut(Endpoint* e) {
  if (e->out.empty()) return true;
  if (!WriteSome(e->fd, &e->out)) return false;
  // Watch for room to write only while bytes wait.
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (e->out.empty() ? 0u : uint32_t{EPOLLOUT});
  ev.data.fd = e->fd;
  epoll_ctl(sock_epoll_fd, EPOLL_CTL_MOD, e->fd, &ev);
  return true;
}

void UcxTransport::Core::OnEndpointSocket(uint64_t ep_id, uint32_t events) {
  Endpoint* e = endpoints.at(ep_id).get();
  if (e->failed) return;
  if (events & EPOLLOUT) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      return FailEndpoint(ep_id, Unavailable(fmt::format("connect to {}: {}", e->peer,
                                                         std::strerror(err))));
    }
    if (!FlushOut(e)) return FailEndpoint(ep_id, Unavailable("peer connection closed"));
  }
  if (!(events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return;
  if (e->ready) {
    // The bootstrap socket carries nothing after the welcome: a byte on it
    // is a protocol error, and its close means the other side is gone.
    uint8_t b;
    ssize_t n = recv(e->fd, &b, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n > 0) CountError("bytes_after_bootstrap");
    return FailEndpoint(ep_id, Unavailable(n > 0 ? "peer broke the bootstrap protocol"
                                                 : "peer connection closed"));
  }
  uint8_t buf[kBootstrapHeaderBytes + kMaxBootstrapBody];
  ssize_t n = recv(e->fd, buf, sizeof(buf) - e->in.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    return FailEndpoint(ep_id,
                        Unavailable(fmt::format("{} closed the connection in its bootstrap", e->peer)));
  }
  e->in.insert(e->in.end(), buf, buf + n);
  BootstrapMessage m;
  size_t used = 0;
  const char* reason = "";
  BootstrapParse r = ParseBootstrap(e->in, &m, &used, &reason);
  if (r == BootstrapParse::kNeedMore) return;
  if (r == BootstrapParse::kInvalid || used != e->in.size() ||
      m.kind == BootstrapKind::kHello || m.kind == BootstrapKind::kProof ||
      (m.kind == BootstrapKind::kChallenge && (!e->auth || e->challenged))) {
    CountError("bad_welcome");
    if (std::string_view(reason) == "bad_version") {
      return FailEndpoint(ep_id, Unavailable(fmt::format(
                                     "{} speaks another version of kvpool's peer protocol (this "
                                     "node: bootstrap version {}); run one kvpool version "
                                     "across the cluster",
                                     e->peer, kBootstrapVersion)));
    }
    return FailEndpoint(ep_id, Unavailable(fmt::format("{} is not a kvpool peer", e->peer)));
  }
  if (m.kind == BootstrapKind::kRefuse) {
    std::string why(AsString(m.body));
    std::string text = fmt::format("{} refused the connection: {}", e->peer, why);
    return FailEndpoint(ep_id, why.starts_with(kRefusedPermission) ? PermissionDenied(text)
                                                                     : Unavailable(text));
  }
  if (m.kind == BootstrapKind::kChallenge) {
    std::string listener;
    Result<std::vector<uint8_t>> proof = e->auth->Answer(m.body, &listener);
    if (!proof.ok()) {
      CountError("listener_auth_failed");
      return FailEndpoint(ep_id, PermissionDenied(fmt::format("{}: {}", e->peer,
                                                              proof.status().message())));
    }
    if (e->auth->encrypted()) {
      const SessionKeys& k = e->auth->session_keys();
      Result<std::unique_ptr<PeerSeal>> made =
          PeerSeal::Make(k.connector_to_listener, k.listener_to_connector);
      if (!made.ok()) return FailEndpoint(ep_id, made.status());
      e->seal = std::move(made).value();
      encrypted_connector->Inc();
    }
    LogDebug("transport: peer {} at {} authenticated{}", listener, e->peer,
             e->seal != nullptr ? ", encrypted" : "");
    authenticated_connector->Inc();
    e->challenged = true;
    e->in.clear();
    BootstrapMessage pm;
    pm.kind = BootstrapKind::kProof;
    pm.body = std::move(proof).value();
    std::vector<uint8_t> out = EncodeBootstrap(pm);
    e->out.insert(e->out.end(), out.begin(), out.end());
    if (!FlushOut(e)) return FailEndpoint(ep_id, Unavailable("peer connection closed"));
    return;
  }
  if (e->auth && !e->challenged) {
    CountError("listener_auth_skipped");
    return FailEndpoint(ep_id, PermissionDenied(fmt::format(
                                   "{} does not authenticate (no cluster key there?)", e->peer)));
  }
  Result<ucp_ep_h> ep = CreateUcpEndpoint(e, m.body);
  if (!ep.ok()) return FailEndpoint(ep_id, Unavailable(ep.status().message()));
  e->ep = *ep;
  e->token = m.token;
  e->ready = true;
  Revive(e);  // the welcome came: the link works
  e->in.clear();
  bootstrapping.erase(ep_id);
  std::vector<std::function<void()>> waiting;
  waiting.swap(e->waiting);
  for (auto& send : waiting) send();
}

void UcxTransport::Core::CloseIdleEndpoints() {
  if (opts.idle_close.count() <= 0) return;
  const auto now = SteadyClock::now();
  if (now < next_idle_sweep) return;
  next_idle_sweep = now + IdleSweepEvery();
  std::vector<uint64_t> idle;
  for (const auto& [id, used] : LastUseOfIdleClients()) {
    if (now - used >= opts.idle_close) idle.push_back(id);
  }
  for (uint64_t id : idle) {
    idle_closed->Inc();
    FailEndpoint(id, Unavailable("peer connection closed idle"));
  }
}

bool UcxTransport::Core::CloseLeastRecentIdle() {
  uint64_t oldest = 0;
  SteadyClock::time_point oldest_use = SteadyClock::time_point::max();
  for (const auto& [id, used] : LastUseOfIdleClients()) {
    if (used < oldest_use) {
      oldest = id;
      oldest_use = used;
    }
  }
  if (oldest == 0) return false;
  idle_closed->Inc();
  FailEndpoint(oldest, Unavailable("peer connection closed idle"));
  return true;
}

std::vector<std::pair<uint64_t, SteadyClock::time_point>> UcxTransport::Core::LastUseOfIdleClients()
    const {
  struct Answered {
    SteadyClock::time_point last;
    bool serving = false;
  };
  std::unordered_map<ucp_ep_h, Answered> answered_on;
  for (const auto& [id, e] : endpoints) {
    if (e->client || e->failed || e->reply_ep == nullptr) continue;
    Answered& a = answered_on[e->reply_ep];
    a.last = std::max(a.last, e->last_request);
    a.serving = a.serving || e->in_service > 0;
  }
  std::vector<std::pair<uint64_t, SteadyClock::time_point>> out;
  out.reserve(client_eps.size());
  for (const auto& [peer, id] : client_eps) {
    const Endpoint& e = *endpoints.at(id);
    if (!Idle(e)) continue;
    auto it = answered_on.find(e.ep);
    if (it == answered_on.end()) {
      out.emplace_back(id, e.last_used);
    } else if (!it->second.serving) {
      out.emplace_back(id, std::max(e.last_used, it->second.last));
    }
  }
  return out;
}

void UcxTransport::Core::ExpireBootstraps() {
  auto now = SteadyClock::now();
  std::vector<int> late;
  for (auto& [fd, p] : pending) {
    if (p.deadline <= now) late.push_back(fd);
  }
  for (int fd : late) {
    CountRefused("bootstrap_timeout");
    ClosePending(fd);
  }
  std::vector<uint64_t> late_eps;
  for (uint64_t id : bootstrapping) {
    auto it = endpoints.find(id);
    if (it != endpoints.end() && it->second->bootstrap_deadline <= now) late_eps.push_back(id);
  }
  for (uint64_t id : late_eps) {
    FailEndpoint(id, Unavailable("peer connection bootstrap timed out"));
  }
}

}  // namespace kvpool::transport
