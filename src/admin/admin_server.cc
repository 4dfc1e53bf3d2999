// AdminServer: a small HTTP/1.1 server of kvpool's own on epoll. One admin
// thread owns every socket (accept, read, write, deadlines) and answers the
// health endpoints inline; the request threads only build response bodies
// from the hooks and the registry. This file is the one boundary where errno
// values and exceptions thrown by hooks become Status values, logs or HTTP
// 500s.

#include "admin/admin_server.h"

#include <netdb.h>
#include <openssl/crypto.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "admin/dashboard_page.h"
#include "admin/http_request.h"
#include "admin/metrics_history.h"
#include "common/check.h"
#include "common/event_loop_fds.h"
#include "common/log.h"
#include "common/thread_annotations.h"

namespace kvpool {

Status AdminOptions::Validate() const {
  if (bind_address.empty()) return InvalidArgument("admin: bind_address is empty");
  if (port < 0 || port > 65535) {
    return InvalidArgument("admin: port must be in 0..65535, got " + std::to_string(port));
  }
  if (threads < 1 || threads > 16) {
    return InvalidArgument("admin: threads must be in 1..16, got " + std::to_string(threads));
  }
  if (max_connections < 1 || max_connections > 1000000) {
    return InvalidArgument("admin: max_connections must be in 1..1000000, got " +
                           std::to_string(max_connections));
  }
  if (request_timeout.count() < 1) return InvalidArgument("admin: request_timeout must be > 0");
  if (max_queued_requests < 1 || max_queued_requests > 100000) {
    return InvalidArgument("admin: max_queued_requests must be in 1..100000, got " +
                           std::to_string(max_queued_requests));
  }
  return history.Validate();
}

namespace {

using SteadyClock = std::chrono::steady_clock;
using admin::HeadParse;
using admin::HttpRequestHead;

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kJsonContentType[] = "application/json";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";
constexpr char kHtmlContentType[] = "text/html; charset=utf-8";

// The browser enforces "no network fetches" for us: the page may only talk to
// the node that served it, and scripts/styles must be the inline ones.
constexpr char kDashboardCsp[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

// The request-counter label set is fixed: every other path counts as "other".
constexpr std::array<std::string_view, 13> kKnownPaths = {"/",
                                                          "/metrics",
                                                          "/healthz",
                                                          "/readyz",
                                                          "/readyz/cluster",
                                                          "/api/v1/status",
                                                          "/api/v1/config",
                                                          "/api/v1/members",
                                                          "/api/v1/history",
                                                          "/api/v1/clients",
                                                          "/api/v1/cluster",
                                                          "/api/v1/lookup",
                                                          "/api/v1/hints"};
constexpr std::string_view kOtherPath = "other";

// Only GETs of short URLs are served: a head beyond this is refused (431).
constexpr size_t kMaxHeadBytes = 8192;
// A POST body (a prefix lookup's hashes, a hint's keys) at most.
constexpr size_t kMaxBodyBytes = 1 << 20;
// After its response a connection is shut for writing and drained briefly,
// so a client still sending (a body we refused) reads the response instead
// of a reset. Bounded in time and bytes.
constexpr auto kMaxLinger = std::chrono::milliseconds(1000);
constexpr size_t kMaxLingerBytes = 64 * 1024;
// How often deadlines are checked: the resolution of every timeout here.
constexpr auto kTick = std::chrono::milliseconds(50);
// Connections closed per deadline pass. Thousands expiring together (a
// flood of idle connections) are closed in slices with events served in
// between, so a health probe never waits behind the whole batch.
constexpr size_t kMaxClosesPerPass = 256;

constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
constexpr uint64_t kFirstConnId = 2;  // connection ids follow the two tags

std::string ErrorJson(std::string_view error, std::string_view path) {
  nlohmann::json j = {{"error", error}, {"path", path}};
  // The path comes from the client; replace invalid UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string_view Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 401:
      return "Unauthorized";
    case 405: return "Method Not Allowed";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

struct Response {
  int status = 200;
  std::string content_type = kTextContentType;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // beyond the fixed ones
};

// Every response closes its connection: keep-alive would let one open
// dashboard (polling every 2 s) or an idle client hold a connection between
// requests, and a new loopback connection per request is cheap at this rate.
std::string Serialize(const Response& r, bool head_only) {
  std::string out;
  out.reserve(256 + (head_only ? 0 : r.body.size()));
  out += "HTTP/1.1 ";
  out += std::to_string(r.status);
  out += ' ';
  out += Reason(r.status);
  out += "\r\nContent-Type: ";
  out += r.content_type;
  out += "\r\nContent-Length: ";
  out += std::to_string(r.body.size());
  out += "\r\nCache-Control: no-store\r\nConnection: close\r\n";
  for (const auto& [name, value] : r.headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  out += "\r\n";
  if (!head_only) out += r.body;
  return out;
}

Response Error(int status, std::string_view what, std::string_view path) {
  Response r;
  r.status = status;
  r.content_type = kJsonContentType;
  r.body = ErrorJson(what, path);
  return r;
}

enum class ConnState {
  kReading,    // waiting for the request head
  kQueued,     // a request thread is building the response
  kWriting,    // sending the response
  kLingering,  // response sent, write side shut; draining until EOF
};

struct Conn {
  int fd = -1;
  ConnState state = ConnState::kReading;
  SteadyClock::time_point deadline;
  std::string in;  // request head bytes so far (<= kMaxHeadBytes), then a POST's body
  // A POST whose head was read: the head, and the bytes its body ends at.
  std::optional<HttpRequestHead> post;
  size_t post_end = 0;
  std::string out;  // response bytes
  size_t out_offset = 0;
  size_t drained = 0;  // bytes discarded while lingering
  uint32_t events = EPOLLIN | EPOLLRDHUP;  // registered with epoll
};

struct Job {
  uint64_t conn_id = 0;
  std::string path;
  bool head_only = false;
  std::optional<std::string> body;  // a POST's
};

class HttpAdminServer final : public AdminServer {
 public:
  HttpAdminServer(const AdminOptions& options, MetricsRegistry* metrics, AdminHooks hooks)
      : options_(options),
        metrics_(metrics),
        hooks_(std::move(hooks)),
        history_(options.history, metrics) {
    // Registered up front so every series is exported (as 0) from the start.
    for (size_t i = 0; i < kKnownPaths.size(); ++i) {
      path_counters_[i] = RegisterCounter(kKnownPaths[i]);
    }
    other_counter_ = RegisterCounter(kOtherPath);
    open_gauge_ = metrics->GetGauge("kvpool_admin_connections", "Open admin HTTP connections");
    refused_ = metrics->GetCounter(
        "kvpool_admin_connections_refused_total",
        "Admin connections refused (503) at max connections with every connection in service, "
        "or when the node is out of file descriptors");
    evicted_ = metrics->GetCounter(
        "kvpool_admin_connections_evicted_total",
        "Admin connections still waiting for their request closed to make room for a new one");
    timed_out_ = metrics->GetCounter(
        "kvpool_admin_connections_timed_out_total",
        "Admin connections closed because the request or response took longer than the timeout");
    bad_requests_ = metrics->GetCounter("kvpool_admin_bad_requests_total",
                                        "Admin requests refused as malformed (400, 431, 505)");
    queued_gauge_ = metrics->GetGauge(
        "kvpool_admin_queued_requests",
        "Admin requests waiting for a request thread (at most --admin-max-queued)");
    queue_full_ = metrics->GetCounter(
        "kvpool_admin_queue_full_total",
        "Admin requests answered 503 because the request threads' queue was full");
    unauthorized_ = metrics->GetCounter(
        "kvpool_admin_unauthorized_total",
        "Admin requests answered 401: no or a wrong bearer token (with --admin-token-file)");
  }

  ~HttpAdminServer() override {
    Stop();
    for (auto& [id, c] : conns_) ::close(c.fd);
    CloseFds({listen_fd_, epoll_fd_, wake_fd_, spare_fd_});
  }

  Status Bind() {
    KVPOOL_RETURN_IF_ERROR(OpenEventLoopFds("admin", &epoll_fd_, &wake_fd_, &spare_fd_));

    const std::string where = options_.bind_address + ":" + std::to_string(options_.port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int gai = getaddrinfo(options_.bind_address.c_str(), std::to_string(options_.port).c_str(),
                          &hints, &res);
    if (gai != 0) return IOError("admin: cannot resolve " + where + ": " + gai_strerror(gai));
    int err = 0;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
      if (fd < 0) {
        err = errno;
        continue;
      }
      // SO_REUSEADDR only: SO_REUSEPORT would let a second node bind the same
      // admin port and silently take half its requests.
      int yes = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 4096) == 0) {
        listen_fd_ = fd;
        break;
      }
      err = errno;
      ::close(fd);
    }
    freeaddrinfo(res);
    if (listen_fd_ < 0) return IOError("admin: cannot bind " + where + ": " + std::strerror(err));
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    WatchListenerAndWake(epoll_fd_, listen_fd_, kListenTag, wake_fd_, kWakeTag);
    return Status::Ok();
  }

  void Serve() {
    history_.Start();
    for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
    thread_ = std::thread([this] { EventLoop(); });
  }

  int port() const override { return port_; }

  void Stop() override {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    history_.Stop();
    // Request threads finish what is queued (its responses are written on a
    // last pass of the loop), then the loop closes everything.
    {
      std::lock_guard q(queue_mu_);
      workers_stop_ = true;
    }
    queue_cv_.notify_all();
    for (auto& t : workers_) t.join();
    loop_stop_.store(true);
    Wake();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Counter* RegisterCounter(std::string_view path) {
    return metrics_->GetCounter("kvpool_admin_requests_total",
                                "Admin HTTP requests received, by path (unknown paths: other).",
                                {{"path", std::string(path)}});
  }

  Counter* CounterFor(const std::string& path) {
    for (size_t i = 0; i < kKnownPaths.size(); ++i) {
      if (path == kKnownPaths[i]) return path_counters_[i];
    }
    return other_counter_;
  }

  void Wake() { SignalEventFd(wake_fd_); }

  // ---- the admin thread ---------------------------------------------------

  void EventLoop() {
    std::vector<epoll_event> events(256);
    auto next_tick = SteadyClock::now() + kTick;
    bool more_expired = false;
    while (!loop_stop_.load()) {
      int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                         more_expired ? 0 : static_cast<int>(kTick.count()));
      if (n < 0 && errno != EINTR) {
        LogError("admin: epoll_wait: {}", std::strerror(errno));
        break;
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[i].data.u64;
        if (tag == kListenTag) {
          AcceptAll();
        } else if (tag == kWakeTag) {
          DrainEventFd(wake_fd_);
          TakeDone();
        } else {
          OnEvent(tag, events[i].events);
        }
      }
      if (more_expired || SteadyClock::now() >= next_tick) {
        more_expired = ExpireDeadlines();
        next_tick = SteadyClock::now() + kTick;
      }
    }
    TakeDone();  // responses the request threads finished while stopping
    ::close(listen_fd_);
    listen_fd_ = -1;
    for (auto& [id, c] : conns_) {
      if (c.state == ConnState::kWriting) WriteSome(c);
      ::close(c.fd);
    }
    conns_.clear();
    open_gauge_->Set(0);
  }

  void AcceptAll() {
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: take one connection off the backlog with the
          // spare descriptor and close it, so the listener does not stay
          // readable and spin the loop.
          refused_->Inc();
          RefuseWithSpareFd(listen_fd_, &spare_fd_, nullptr);
          LogWarn("admin: out of file descriptors; connections refused");
          return;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          LogWarn("admin: accept: {}", std::strerror(errno));
        }
        return;
      }
      if (conns_.size() >= static_cast<size_t>(options_.max_connections) && !EvictOldestWaiting()) {
        // Everything open is being served: tell this one to come back. A
        // fresh socket's send buffer takes the short reply without blocking.
        refused_->Inc();
        Response r = Error(503, "too many connections", "");
        r.headers.emplace_back("Retry-After", "1");
        std::string bytes = Serialize(r, false);
        ssize_t w = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        (void)w;
        ::close(fd);
        continue;
      }
      const uint64_t id = next_id_++;
      Conn& c = conns_[id];
      c.fd = fd;
      c.deadline = SteadyClock::now() + options_.request_timeout;
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = id;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      open_gauge_->Set(static_cast<int64_t>(conns_.size()));
    }
  }

  // Closes the oldest connection that holds no request in service (still
  // sending its head, or lingering after its response). Connection ids grow
  // with accept order, so the map's first match is the oldest.
  bool EvictOldestWaiting() {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      if (it->second.state == ConnState::kReading || it->second.state == ConnState::kLingering) {
        if (it->second.state == ConnState::kReading) evicted_->Inc();
        Close(it->first);
        return true;
      }
    }
    return false;
  }

  void Close(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
    ::close(it->second.fd);
    conns_.erase(it);
    open_gauge_->Set(static_cast<int64_t>(conns_.size()));
  }

  // What the loop waits for follows the state: nothing is read while a
  // request is served (bytes after the head would keep a level-triggered
  // epoll busy), and hang-ups and errors are always reported.
  void UpdateInterest(uint64_t id, Conn& c) {
    uint32_t events = 0;
    switch (c.state) {
      case ConnState::kReading:
      case ConnState::kLingering: events = EPOLLIN | EPOLLRDHUP; break;
      case ConnState::kQueued: events = 0; break;
      case ConnState::kWriting: events = EPOLLOUT; break;
    }
    if (events == c.events) return;
    c.events = events;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void OnEvent(uint64_t id, uint32_t events) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Conn& c = it->second;
    // Each branch may close the connection: none touches c afterwards.
    if ((events & EPOLLOUT) && c.state == ConnState::kWriting) {
      if (!WriteSome(c)) return Close(id);
      if (c.out_offset == c.out.size()) StartLinger(id, c);
      return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      switch (c.state) {
        case ConnState::kReading:
          if (!ReadHead(id, c)) Close(id);
          break;
        case ConnState::kLingering:
          if (!Drain(c)) Close(id);
          break;
        case ConnState::kQueued:
        case ConnState::kWriting:
          // Bytes after the head are not read until the response is out;
          // a hang-up means nobody waits for it.
          if (events & (EPOLLHUP | EPOLLERR)) Close(id);
          break;
      }
    }
  }

  // Returns false when the connection is to be closed now. Once a request
  // is dispatched the connection may be gone: c is not touched after.
  bool ReadHead(uint64_t id, Conn& c) {
    char buf[kMaxHeadBytes];
    while (true) {
      const size_t room =
          c.post ? std::min(sizeof(buf), c.post_end - c.in.size()) : kMaxHeadBytes - c.in.size();
      ssize_t r = ::recv(c.fd, buf, room == 0 ? 1 : room, 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      if (r == 0) return false;  // closed before a full request: nobody to answer
      c.in.append(buf, static_cast<size_t>(r));
      if (c.post) {
        if (c.in.size() < c.post_end) continue;
        HttpRequestHead head = std::move(*c.post);
        c.post.reset();
        std::string body = c.in.substr(c.post_end - static_cast<size_t>(head.content_length));
        Dispatch(id, c, head, std::move(body));
        return true;
      }
      HttpRequestHead head;
      size_t head_bytes = 0;
      switch (admin::ParseRequestHead(c.in, kMaxHeadBytes, &head, &head_bytes)) {
        case HeadParse::kIncomplete:
          continue;
        case HeadParse::kComplete:
          if (head.method == "POST") {
            // The body follows: at most kMaxBodyBytes, and sized.
            if (head.content_length < 0) {
              bad_requests_->Inc();
              Respond(id, c, Error(411, "a POST needs a Content-Length", head.path), false);
              return true;
            }
            if (static_cast<size_t>(head.content_length) > kMaxBodyBytes) {
              bad_requests_->Inc();
              Respond(id, c, Error(413, "request body too large", head.path), false);
              return true;
            }
            c.post_end = head_bytes + static_cast<size_t>(head.content_length);
            if (c.in.size() > c.post_end) c.in.resize(c.post_end);  // one request a connection
            c.post = std::move(head);
            if (c.in.size() < c.post_end) continue;
            HttpRequestHead h = std::move(*c.post);
            c.post.reset();
            std::string body = c.in.substr(head_bytes);
            Dispatch(id, c, h, std::move(body));
            return true;
          }
          Dispatch(id, c, head, std::nullopt);
          return true;
        case HeadParse::kBad:
          bad_requests_->Inc();
          Respond(id, c, Error(400, "bad request", ""), false);
          return true;
        case HeadParse::kTooLarge:
          bad_requests_->Inc();
          Respond(id, c, Error(431, "request head too large", ""), false);
          return true;
        case HeadParse::kBadVersion:
          bad_requests_->Inc();
          Respond(id, c, Error(505, "HTTP/1.0 and HTTP/1.1 only", ""), false);
          return true;
      }
    }
    return true;
  }

  // Health and readiness are answered here on the admin thread, so a
  // liveness probe never waits behind a slow scrape or a busy hook.
  void Dispatch(uint64_t id, Conn& c, const HttpRequestHead& head,
                std::optional<std::string> body) {
    CounterFor(head.path)->Inc();
    c.in.clear();
    c.in.shrink_to_fit();
    const bool head_only = head.method == "HEAD";
    const bool post = head.method == "POST";
    const bool post_path = head.path == "/api/v1/lookup" || head.path == "/api/v1/hints";
    if (post != post_path || (head.method != "GET" && !head_only && !post)) {
      Response r = Error(405, "method not allowed", head.path);
      r.headers.emplace_back("Allow", post_path ? "POST" : "GET, HEAD");
      return Respond(id, c, r, false);
    }
    if (head.path == "/healthz") {
      Response r;
      r.body = "ok";
      return Respond(id, c, r, head_only);
    }
    if (head.path == "/readyz" || head.path == "/readyz/cluster") {
      // /readyz: local work (engines on the socket); /readyz/cluster: remote
      // work too. The detail says what is still missing.
      Response r;
      const bool ready = !hooks_.ready || hooks_.ready();
      const std::string missing = ready && hooks_.cluster_missing ? hooks_.cluster_missing() : "";
      if (!ready) {
        r.status = 503;
        r.body = "not ready";
      } else if (missing.empty()) {
        r.body = "ready";
      } else if (head.path == "/readyz") {
        r.body = "ready for local work; not yet for cluster work: " + missing;
      } else {
        r.status = 503;
        r.body = "not ready for cluster work: " + missing;
      }
      return Respond(id, c, r, head_only);
    }
    if (!Authorized(head)) {
      unauthorized_->Inc();
      Response r = Error(401, "a bearer token is needed", head.path);
      r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"kvpool\"");
      return Respond(id, c, r, head_only);
    }
    {
      std::lock_guard lock(queue_mu_);
      if (queue_.size() < static_cast<size_t>(options_.max_queued_requests) && !workers_stop_) {
        queue_.push_back(Job{id, head.path, head_only, std::move(body)});
        queued_gauge_->Set(static_cast<int64_t>(queue_.size()));
        c.state = ConnState::kQueued;
        c.deadline = SteadyClock::time_point::max();  // the request threads' turn
        UpdateInterest(id, c);
        queue_cv_.notify_one();
        return;
      }
    }
    queue_full_->Inc();
    Response r = Error(503, "busy", head.path);
    r.headers.emplace_back("Retry-After", "1");
    Respond(id, c, r, head_only);
  }

  // Whether the request may see more than health and readiness.
  bool Authorized(const HttpRequestHead& head) const {
    const std::string& token = options_.bearer_token;
    if (token.empty()) return true;
    std::string_view got = head.authorization;
    constexpr std::string_view kScheme = "Bearer ";
    if (got.size() != kScheme.size() + token.size() || got.substr(0, kScheme.size()) != kScheme) {
      return false;
    }
    return CRYPTO_memcmp(got.data() + kScheme.size(), token.data(), token.size()) == 0;
  }

  void Respond(uint64_t id, Conn& c, const Response& r, bool head_only) {
    c.out = Serialize(r, head_only);
    c.out_offset = 0;
    c.state = ConnState::kWriting;
    c.deadline = SteadyClock::now() + options_.request_timeout;
    if (!WriteSome(c)) return Close(id);
    if (c.out_offset == c.out.size()) return StartLinger(id, c);
    UpdateInterest(id, c);
  }

  // Returns false on a write error.
  bool WriteSome(Conn& c) {
    while (c.out_offset < c.out.size()) {
      ssize_t w = ::send(c.fd, c.out.data() + c.out_offset, c.out.size() - c.out_offset,
                         MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      c.out_offset += static_cast<size_t>(w);
    }
    return true;
  }

  void StartLinger(uint64_t id, Conn& c) {
    c.out.clear();
    c.out.shrink_to_fit();
    c.state = ConnState::kLingering;
    c.deadline =
        SteadyClock::now() + std::min<SteadyClock::duration>(kMaxLinger, options_.request_timeout);
    UpdateInterest(id, c);
    ::shutdown(c.fd, SHUT_WR);
    if (!Drain(c)) Close(id);
  }

  // Reads and drops what the client still sends. Returns false at EOF, on
  // an error, or past the byte bound: the connection is done.
  bool Drain(Conn& c) {
    char buf[4096];
    while (true) {
      ssize_t r = ::recv(c.fd, buf, sizeof(buf), 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      if (r == 0) return false;
      c.drained += static_cast<size_t>(r);
      if (c.drained > kMaxLingerBytes) return false;
    }
  }

  // Closes connections past their deadline, at most kMaxClosesPerPass.
  // Returns true when more are past it.
  bool ExpireDeadlines() {
    const auto now = SteadyClock::now();
    std::vector<uint64_t> expired;
    bool more = false;
    for (const auto& [id, c] : conns_) {
      if (now < c.deadline) continue;
      if (expired.size() == kMaxClosesPerPass) {
        more = true;
        break;
      }
      expired.push_back(id);
    }
    for (uint64_t id : expired) {
      // A lingering connection has its answer; only the others timed out.
      if (conns_[id].state != ConnState::kLingering) timed_out_->Inc();
      Close(id);
    }
    return more;
  }

  // Hands finished responses from the request threads to their connections.
  void TakeDone() {
    std::deque<std::pair<uint64_t, std::string>> done;
    {
      std::lock_guard lock(queue_mu_);
      done.swap(done_);
    }
    for (auto& [id, bytes] : done) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;  // the client left meanwhile
      Conn& c = it->second;
      c.out = std::move(bytes);
      c.out_offset = 0;
      c.state = ConnState::kWriting;
      c.deadline = SteadyClock::now() + options_.request_timeout;
      if (!WriteSome(c)) {
        Close(id);
      } else if (c.out_offset == c.out.size()) {
        StartLinger(id, c);
      } else {
        UpdateInterest(id, c);
      }
    }
  }

  // ---- request threads -----------------------------------------------------

  void WorkerLoop() {
    while (true) {
      Job job;
      {
        std::unique_lock lock(queue_mu_);
        queue_cv_.wait(lock, [this] { return workers_stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
        queued_gauge_->Set(static_cast<int64_t>(queue_.size()));
      }
      std::string bytes = Serialize(Build(job.path, job.body), job.head_only);
      {
        std::lock_guard lock(queue_mu_);
        done_.emplace_back(job.conn_id, std::move(bytes));
      }
      Wake();
    }
  }

  // A throwing hook (or std::bad_alloc) becomes a 500 for that request only.
  Response Build(const std::string& path, const std::optional<std::string>& body) {
    try {
      if (body) return Post(path, *body);
      return Route(path);
    } catch (const std::exception& e) {
      LogError("admin: GET {} failed: {}", path, e.what());
    } catch (...) {
      LogError("admin: GET {} failed: unknown exception", path);
    }
    return Error(500, "internal error", path);
  }

  // The node's hook serving a JSON path, or null for another path.
  const std::function<std::string()>* JsonHook(const std::string& path) const {
    const bool untokened = PublicView();
    if (path == "/api/v1/status") return untokened ? &hooks_.untokened->status_json : &hooks_.status_json;
    if (path == "/api/v1/members") return &hooks_.members_json;
    if (path == "/api/v1/cluster") return &hooks_.cluster_json;
    if (path == "/api/v1/clients") {
      return untokened ? &hooks_.untokened->clients_json : &hooks_.clients_json;
    }
    if (path == "/api/v1/config") return &hooks_.config_json;
    return nullptr;
  }

  // Whether requests see the untokened view: the node asks for one and
  // no request carries a token (with a token configured, requests without
  // it are refused before they get here).
  bool PublicView() const { return hooks_.untokened.has_value() && options_.bearer_token.empty(); }

  // The registry's text, less the lines the untokened view hides.
  std::string MetricsText() const {
    std::string all = metrics_->RenderPrometheus();
    if (!PublicView() || !hooks_.untokened->metric_line_visible) return all;
    std::string out;
    out.reserve(all.size());
    for (size_t at = 0; at < all.size();) {
      size_t end = all.find('\n', at);
      end = end == std::string::npos ? all.size() : end + 1;
      std::string_view line(all.data() + at, end - at);
      if (hooks_.untokened->metric_line_visible(line)) out.append(line);
      at = end;
    }
    return out;
  }

  // POST /api/v1/lookup and /api/v1/hints (the POST paths; Dispatch
  // checked it). Hints change what a node keeps: never from the untokened
  // view of a node with tenants.
  Response Post(const std::string& path, const std::string& body) {
    const bool hints = path == "/api/v1/hints";
    const auto& hook = hints ? hooks_.hints : hooks_.lookup;
    if (!hook) return Error(404, "not found", path);
    if (hints && PublicView()) return Error(403, "hints need the admin token", path);
    auto [status, json] = hook(body);
    Response r;
    r.status = status;
    r.content_type = kJsonContentType;
    r.body = std::move(json);
    return r;
  }

  Response Route(const std::string& path) {
    Response r;
    if (path == "/metrics") {
      r.content_type = kMetricsContentType;
      r.body = MetricsText();
    } else if (const auto* hook = JsonHook(path); hook != nullptr) {
      r.content_type = kJsonContentType;
      r.body = *hook ? (*hook)() : "{}";
    } else if (path == "/api/v1/history") {
      r.content_type = kJsonContentType;
      r.body = history_.Json();
      if (PublicView() && !hooks_.untokened->history_hidden.empty()) {
        nlohmann::json h = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
        if (h.is_object() && h.contains("series") && h["series"].is_object()) {
          for (const auto& name : hooks_.untokened->history_hidden) h["series"].erase(name);
          r.body = h.dump();
        }
      }
    } else if (path == "/") {
      r.content_type = kHtmlContentType;
      r.body = DashboardHtml();
      r.headers.emplace_back("Content-Security-Policy", kDashboardCsp);
      r.headers.emplace_back("X-Content-Type-Options", "nosniff");
    } else {
      r = Error(404, "not found", path);
    }
    return r;
  }

  const AdminOptions options_;
  MetricsRegistry* const metrics_;  // not owned; outlives this server
  const AdminHooks hooks_;
  MetricsHistory history_;  // the charts' samples (its own thread)
  std::array<Counter*, kKnownPaths.size()> path_counters_{};
  Counter* other_counter_ = nullptr;
  Gauge* open_gauge_ = nullptr;
  Gauge* queued_gauge_ = nullptr;  // queue_.size(), set under queue_mu_
  Counter* refused_ = nullptr;
  Counter* evicted_ = nullptr;
  Counter* timed_out_ = nullptr;
  Counter* bad_requests_ = nullptr;
  Counter* queue_full_ = nullptr;
  Counter* unauthorized_ = nullptr;

  int port_ = -1;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int spare_fd_ = -1;
  std::thread thread_;  // the node's admin thread: the event loop
  std::vector<std::thread> workers_;
  std::atomic<bool> loop_stop_{false};

  // Owned by the admin thread.
  std::map<uint64_t, Conn> conns_;
  uint64_t next_id_ = kFirstConnId;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  // Protected by queue_mu_: requests for the request threads, responses
  // for the admin thread, and the request threads' stop flag.
  std::deque<Job> queue_ GUARDED_BY(queue_mu_);
  std::deque<std::pair<uint64_t, std::string>> done_ GUARDED_BY(queue_mu_);
  bool workers_stop_ GUARDED_BY(queue_mu_) = false;

  std::mutex stop_mu_;
  bool stopped_ GUARDED_BY(stop_mu_) = false;
};

}  // namespace

Result<std::unique_ptr<AdminServer>> AdminServer::Start(const AdminOptions& options,
                                                        MetricsRegistry* metrics,
                                                        AdminHooks hooks) {
  KVPOOL_CHECK(metrics != nullptr);
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto server = std::make_unique<HttpAdminServer>(options, metrics, std::move(hooks));
  KVPOOL_RETURN_IF_ERROR(server->Bind());
  server->Serve();
  LogInfo("admin: serving on http://{}:{}/", options.bind_address, server->port());
  return std::unique_ptr<AdminServer>(std::move(server));
}

}  // namespace kvpool
