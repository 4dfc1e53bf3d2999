#include "node/local_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/event_loop_fds.h"
#include "common/executor.h"
#include "common/log.h"
#include "node/local_ops.h"
#include "node/socket_dir.h"
#include "protocol/codec.h"

namespace kvpool {

using protocol::FrameHeader;
using protocol::MessageType;

Status LocalServerOptions::Validate() const {
  if (socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument(
        fmt::format("socket path longer than {} bytes", sizeof(sockaddr_un::sun_path) - 1));
  }
  if (max_connections < 1) return InvalidArgument("max_connections must be >= 1");
  if (max_batch < 1 || max_batch > protocol::kMaxBatch) {
    return InvalidArgument(fmt::format("max_batch must be in 1..{}", protocol::kMaxBatch));
  }
  if (max_frame_bytes < 64 * 1024) return InvalidArgument("max_frame_bytes must be >= 64KiB");
  if (max_buffered_bytes < uint64_t{max_frame_bytes} + protocol::kHeaderBytes) {
    return InvalidArgument(fmt::format(
        "max_buffered_bytes ({}) must hold at least one largest frame (max_frame_bytes {} + {})",
        max_buffered_bytes, max_frame_bytes, protocol::kHeaderBytes));
  }
  if (idle_timeout.count() < 1 || frame_timeout.count() < 1 || handshake_timeout.count() < 1) {
    return InvalidArgument("idle, frame and handshake timeouts must be > 0");
  }
  return Status::Ok();
}

namespace {

constexpr size_t kReadChunk = 256 * 1024;
// Each connection may buffer this much request input without charge to the
// node-wide budget (max_buffered_bytes), so small requests never wait
// behind large frames; beyond it, buffer capacity is charged.
constexpr size_t kFreeBufferBytes = 64 * 1024;
// First allocation of a connection's input buffer, and the least room a
// read is given before the buffer grows.
constexpr size_t kInitialBuffer = 16 * 1024;
constexpr size_t kMinRoom = 4096;
// Up to this much of an announced frame is allocated at once (charged to
// the budget); beyond it the buffer doubles as bytes arrive. Spares a 1 MiB
// copy-mode put six reallocations without trusting a header for 80 MiB.
constexpr size_t kEagerBytes = 1 << 20;

size_t Charged(size_t capacity) {
  return capacity > kFreeBufferBytes ? capacity - kFreeBufferBytes : 0;
}

// A connection's unparsed input. It grows only as bytes arrive (doubling,
// and never past the current frame's length), not to what a header
// announces, and it is freed once empty if larger than kFreeBufferBytes.
struct InBuffer {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0;
  size_t capacity = 0;

  void Consume(size_t n) {
    std::memmove(data.get(), data.get() + n, size - n);
    size -= n;
  }
  void Grow(size_t new_capacity) {
    auto bigger = std::make_unique_for_overwrite<uint8_t[]>(new_capacity);
    if (size > 0) std::memcpy(bigger.get(), data.get(), size);
    data = std::move(bigger);
    capacity = new_capacity;
  }
  void Free() {
    data.reset();
    size = 0;
    capacity = 0;
  }
};

// A connection: its operation state (LocalSession) and the loop's.
struct Conn : LocalSession {
  bool epollout = false;
  bool reading_paused = false;
  bool starved = false;  // waits for the node-wide buffer budget
  std::chrono::steady_clock::time_point accepted;
  // Last byte received or reply fully sent: the idle clock.
  std::chrono::steady_clock::time_point last_active;
  // When the partial frame at the start of `in` began arriving.
  std::chrono::steady_clock::time_point frame_start;
  InBuffer in;
};

class LocalServerImpl final : public LocalServer {
 public:
  LocalServerImpl(const LocalServerOptions& o, TieredStore* tiered, ClusterFaces cluster,
                  MetricsRegistry* m, std::function<std::string()> stats_json,
                  std::vector<LocalTenant> tenants)
      : opts_(o),
        tiered_(tiered),
        cluster_(cluster),
        tenants_(std::move(tenants)),
        tenant_conns_(std::make_unique<std::atomic<int>[]>(tenants_.size() + 1)),
        stats_json_(std::move(stats_json)) {
    conns_gauge_ = m->GetGauge("kvpool_local_connections", "Open local client connections");
    accepted_ = m->GetCounter("kvpool_accepted_connections_total", "Local connections accepted");
    rejected_ = m->GetCounter("kvpool_rejected_connections_total",
                              "Local connections refused at the max-connections limit (told "
                              "RESOURCE_EXHAUSTED: too many connections) or out of descriptors");
    for (int r = 0; r < kNumRefusedReasons; ++r) {
      refused_[r] = m->GetCounter("kvpool_local_connections_refused_total",
                                  "Local connections refused at a connection cap, by cap (node: "
                                  "--max-connections; uid, tenant: per uid, per tenant)",
                                  {{"cap", kRefusedReasonNames[r]}});
    }
    for (int r = 0; r < kNumReapReasons; ++r) {
      reaped_[r] = m->GetCounter("kvpool_local_connections_reaped_total",
                                 "Local connections closed by the node, by deadline missed",
                                 {{"reason", kReapReasonNames[r]}});
    }
    buffered_gauge_ = m->GetGauge(
        "kvpool_local_request_buffer_bytes",
        "Request buffer bytes charged to --max-buffered (beyond each connection's first 64 KiB)");
    starved_ = m->GetCounter(
        "kvpool_local_reads_deferred_total",
        "Times a connection's read waited because the node-wide request buffer budget was spent");
    metrics_ = m;
  }

  ~LocalServerImpl() override {
    // The copies in flight finish (and post to the loop's wake fd, still
    // open) before the connections and their requests go.
    if (copy_pool_ != nullptr) copy_pool_->Stop();
    for (auto& [fd, c] : conns_) ::close(fd);
    CloseFds({spare_fd_, listen_fd_, epoll_fd_, wake_fd_});
  }

  Status Init() {
    KVPOOL_RETURN_IF_ERROR(OpenEventLoopFds("", &epoll_fd_, &wake_fd_, &spare_fd_));
    handlers_ = std::make_unique<LocalOps>(opts_, tiered_, cluster_, wake_fd_, metrics_,
                                           stats_json_, tenants_);
    if (const int copiers = opts_.ResolvedCopyThreads();
        copiers > 0 && opts_.client_staging_bytes > 0) {
      copy_pool_ = std::make_unique<ThreadPool>(copiers, "kvpool-copy");
      handlers_->set_copy_executor(copy_pool_.get(), copiers);
    }
    // A tenant token moves a connection to its tenant: that tenant's cap
    // counts it from the hello on.
    handlers_->set_admit_tenant([this](int tenant) {
      Status s = AdmitTenant(tenant);
      if (!s.ok()) refused_[kRefusedTenant]->Inc();
      return s;
    });
    KVPOOL_RETURN_IF_ERROR(Bind());
    WatchListenerAndWake(epoll_fd_, listen_fd_, kListenTag, wake_fd_, kWakeTag);
    return Status::Ok();
  }

  void Run() override {
    // Named, so a per-thread CPU figure (top -H, bench/compare.sh local)
    // tells the loop from the node's other threads.
    pthread_setname_np(pthread_self(), "kvpool-local");
    std::vector<epoll_event> events(256);
    auto last_activity = std::chrono::steady_clock::now() - std::chrono::hours(1);
    auto last_expiry = std::chrono::steady_clock::now();
    while (!stop_.load(std::memory_order_relaxed)) {
      auto now = std::chrono::steady_clock::now();
      bool spinning = now - last_activity < std::chrono::microseconds(opts_.poll_spin_us);
      int n =
          epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), spinning ? 0 : 500);
      if (n < 0 && errno != EINTR) {
        LogError("epoll_wait: {}", std::strerror(errno));
        break;
      }
      if (n > 0) last_activity = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kListenTag) {
          AcceptAll();
        } else if (tag == kWakeTag) {
          DrainEventFd(wake_fd_);
          FinishParked();
        } else {
          auto it = conns_.find(static_cast<int>(tag));
          if (it == conns_.end()) continue;
          Conn& c = it->second;
          if (events[i].events & (EPOLLERR | EPOLLHUP)) {
            // Read what is left (a request followed by a close) before closing.
            if (!(events[i].events & EPOLLIN)) {
              CloseConn(c.fd);
              continue;
            }
          }
          if (events[i].events & EPOLLOUT) {
            if (!Flush(c)) {
              CloseConn(c.fd);
              continue;
            }
            // Frames left unparsed while output was backed up.
            if (!c.closing && c.in.size > 0 && c.out_bytes <= opts_.max_output_bytes) {
              ProcessFrames(c);
              ReleaseIfEmpty(c);
              if (!Flush(c)) {
                CloseConn(c.fd);
                continue;
              }
            }
          }
          if (events[i].events & EPOLLIN) {
            if (!OnReadable(c)) {
              CloseConn(c.fd);
              continue;
            }
          }
          Settle(c);
        }
      }
      if (now - last_expiry > std::chrono::milliseconds(50)) {
        ExpireDeadlines(now);
        last_expiry = now;
      }
    }
    std::vector<int> fds;
    for (auto& [fd, c] : conns_) fds.push_back(fd);
    for (int fd : fds) CloseConn(fd);
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(socket_path_.c_str());
  }

  void Stop() override {
    stop_.store(true);
    SignalEventFd(wake_fd_);
  }

  int connections() const override { return num_conns_.load(); }
  std::vector<std::shared_ptr<const ClientRecord>> clients() const override {
    std::lock_guard lock(clients_mu_);
    std::vector<std::shared_ptr<const ClientRecord>> out;
    out.reserve(clients_.size());
    for (const auto& [id, r] : clients_) out.push_back(r);
    return out;
  }
  std::vector<int> tenant_connections() const override {
    std::vector<int> out(tenants_.size() + 1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = tenant_conns_[i].load();
    return out;
  }
  const std::string& socket_path() const override { return socket_path_; }

 private:
  static constexpr uint64_t kListenTag = 1ull << 40;
  static constexpr uint64_t kWakeTag = (1ull << 40) + 1;

  Status Bind() {
    SocketPlacement placement;
    placement.socket_path = opts_.socket_path;
    placement.xdg_runtime_dir = opts_.xdg_runtime_dir;
    placement.group = opts_.socket_group;
    placement.allow_world_writable_dir = opts_.allow_world_writable_dir;
    KVPOOL_ASSIGN_OR_RETURN(socket_path_, PrepareSocketPath(placement));
    if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
      return InvalidArgument(fmt::format("socket path {} is longer than {} bytes", socket_path_,
                                         sizeof(sockaddr_un::sun_path) - 1));
    }
    KVPOOL_RETURN_IF_ERROR(ClaimSocketPath(socket_path_));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return ErrnoStatus("socket", errno);
    // bind() creates the file and fails if anything (even a link) took the
    // name since the claim: it never follows or replaces it.
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(fmt::format("bind {}", socket_path_), errno);
    }
    KVPOOL_RETURN_IF_ERROR(SetSocketAccess(socket_path_, opts_.socket_mode, opts_.socket_group));
    if (::listen(listen_fd_, 512) != 0) return ErrnoStatus("listen", errno);
    return Status::Ok();
  }

  // Tells a connection why the node closes it, in the protocol's error
  // reply with request id 0 (a connection-level error), then closes it. The
  // reply is small and the socket's buffer empty or nearly, so a
  // non-blocking send takes it; if not, the close alone tells.
  enum RefusedReason { kRefusedNode, kRefusedUid, kRefusedTenant, kNumRefusedReasons };
  static constexpr const char* kRefusedReasonNames[kNumRefusedReasons] = {"node", "uid", "tenant"};

  uint32_t PerUidCap() const {
    return opts_.max_connections_per_uid > 0 ? opts_.max_connections_per_uid
                                             : std::max<uint32_t>(1, opts_.max_connections / 2);
  }
  uint32_t PerTenantCap() const {
    return opts_.max_connections_per_tenant > 0
               ? opts_.max_connections_per_tenant
               : std::max<uint32_t>(1, opts_.max_connections * 3 / 4);
  }
  // Whether one more connection of tenant t fits its cap (only with
  // tenants: a single-tenant node has the node's cap alone).
  Status AdmitTenant(int t) const {
    if (!handlers_->has_tenants()) return Status::Ok();
    if (tenant_conns_[t].load() < static_cast<int>(PerTenantCap())) return Status::Ok();
    return ResourceExhausted(fmt::format("too many connections for tenant {} (limit {})",
                                         t == 0 ? std::string(kDefaultTenant)
                                                : tenants_[static_cast<size_t>(t) - 1].spec.name,
                                         PerTenantCap()));
  }
  void Refuse(int fd, RefusedReason why, const Status& s) {
    SendConnectionError(fd, s);
    rejected_->Inc();
    refused_[why]->Inc();
    ::close(fd);
  }

  void SendConnectionError(int fd, const Status& s) {
    std::vector<uint8_t> body;
    protocol::EncodeString(s.message(), &body);
    auto frame = protocol::EncodeFrame(MessageType::kError, 0, static_cast<int32_t>(s.code()), body,
                                       /*reply=*/true);
    ssize_t w = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
  }

  void AcceptAll() {
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
          // Out of descriptors: refuse one waiting connection through the
          // spare descriptor, so the listener does not stay readable.
          if (RefuseWithSpareFd(listen_fd_, &spare_fd_, [this](int dropped) {
                SendConnectionError(dropped,
                                    ResourceExhausted("the node is out of file descriptors"));
              })) {
            rejected_->Inc();
          }
          LogWarn("accept: out of file descriptors; a local connection was refused");
          return;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) LogWarn("accept: {}", std::strerror(errno));
        return;
      }
      if (conns_.size() >= opts_.max_connections) {
        Refuse(fd, kRefusedNode,
               ResourceExhausted(
                   fmt::format("too many connections (limit {})", opts_.max_connections)));
        continue;
      }
      PeerIdentity who;
      if (!IdentifyPeer(fd, &who)) {
        handlers_->ProtocolError("unknown_credentials");
        SendConnectionError(fd, PermissionDenied("the node cannot read this client's credentials "
                                                 "(SO_PEERCRED) to find its tenant"));
        rejected_->Inc();
        ::close(fd);
        continue;
      }
      if (uid_conns_[who.uid] >= static_cast<int>(PerUidCap())) {
        Refuse(fd, kRefusedUid,
               ResourceExhausted(fmt::format("too many connections for uid {} (limit {})", who.uid,
                                             PerUidCap())));
        continue;
      }
      if (Status t = AdmitTenant(who.tenant); !t.ok()) {
        Refuse(fd, kRefusedTenant, t);
        continue;
      }
      int buf = 4 << 20;
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
      Conn& c = conns_[fd];
      c.fd = fd;
      c.id = ++conn_ids_;
      c.accepted = std::chrono::steady_clock::now();
      c.last_active = c.accepted;
      c.peer_pid = who.pid;
      c.peer_uid = who.uid;
      c.peer_gid = who.gid;
      c.tenant = who.tenant;
      c.counted_tenant = c.tenant;
      ++tenant_conns_[c.tenant];
      ++uid_conns_[c.peer_uid];
      c.record = std::make_shared<ClientRecord>();
      c.record->id = c.id;
      c.record->pid = who.pid;
      c.record->uid = who.uid;
      c.record->connected = std::chrono::system_clock::now();
      c.record->tenant.store(c.tenant);
      {
        std::lock_guard lock(clients_mu_);
        clients_.emplace(c.id, c.record);
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = static_cast<uint64_t>(fd);
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      accepted_->Inc();
      num_conns_.store(static_cast<int>(conns_.size()));
      conns_gauge_->Set(static_cast<int64_t>(conns_.size()));
    }
  }

  struct PeerIdentity {
    int32_t pid = 0;
    uint32_t uid = 0;
    uint32_t gid = 0;
    int tenant = 0;
  };
  // The peer's credentials (SO_PEERCRED) and the tenant its uid or groups
  // (SO_PEERGROUPS) belong to. False when they cannot be read while tenants
  // are configured: such a peer could belong to any of them.
  bool IdentifyPeer(int fd, PeerIdentity* who) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    bool known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    if (known) *who = {cred.pid, cred.uid, cred.gid, 0};
    if (!handlers_->has_tenants()) return true;
    if (!known) return false;
    std::vector<uint32_t> gids = {cred.gid};
    std::vector<gid_t> groups(64);
    socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) {
      if (errno != ERANGE) return false;
      groups.resize(glen / sizeof(gid_t));
      if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) return false;
    }
    for (size_t i = 0; i < glen / sizeof(gid_t); ++i) gids.push_back(groups[i]);
    who->tenant = handlers_->TenantOf(cred.uid, gids);
    return true;
  }

  void CloseConn(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    const bool was_charged = Charged(it->second.in.capacity) > 0;
    Uncharge(it->second);
    --tenant_conns_[it->second.counted_tenant];
    if (auto u = uid_conns_.find(it->second.peer_uid); u != uid_conns_.end() && --u->second <= 0) {
      uid_conns_.erase(u);
    }
    {
      std::lock_guard lock(clients_mu_);
      clients_.erase(it->second.id);
    }
    // Destroying the handles releases the pins and aborts the reservations.
    conns_.erase(it);
    if (was_charged) ResumeStarved();
    num_conns_.store(static_cast<int>(conns_.size()));
    conns_gauge_->Set(static_cast<int64_t>(conns_.size()));
  }

  // Closes connections past a deadline: the handshake, a frame begun but
  // not finished, and idleness (nothing sent, nothing held, nothing owed).
  void ExpireDeadlines(std::chrono::steady_clock::time_point now) {
    std::vector<std::pair<int, ReapReason>> expired;
    for (auto& [fd, c] : conns_) {
      if (!c.handshaked) {
        if (now - c.accepted > opts_.handshake_timeout) {
          expired.emplace_back(fd, ReapReason::kHandshake);
        }
      } else if (c.in.size > 0) {
        // Only the client's slowness counts: not frames that wait for the
        // node (a parked read, replies the client has not taken yet).
        if (!c.pending && c.out_bytes <= opts_.max_output_bytes &&
            now - c.frame_start > opts_.frame_timeout) {
          expired.emplace_back(fd, ReapReason::kFrame);
        }
      } else if (c.out.empty() && !c.pending && c.pins.empty() && c.reservations.empty() &&
                 now - c.last_active > opts_.idle_timeout) {
        expired.emplace_back(fd, ReapReason::kIdle);
      }
    }
    for (auto [fd, reason] : expired) {
      reaped_[static_cast<int>(reason)]->Inc();
      switch (reason) {
        case ReapReason::kHandshake:
          handlers_->ProtocolError("handshake_timeout");
          break;
        case ReapReason::kFrame:
          handlers_->ProtocolError("frame_timeout");
          SendConnectionError(fd, DeadlineExceeded(fmt::format(
                                      "a frame was not completed within {} ms; connection closed",
                                      opts_.frame_timeout.count())));
          break;
        case ReapReason::kIdle:
          // Unavailable: libkvpool reconnects and retries on it.
          SendConnectionError(
              fd, Unavailable(fmt::format("connection idle for {} ms; closed by the node",
                                          opts_.idle_timeout.count())));
          break;
      }
      CloseConn(fd);
    }
  }

  // ---- request buffers ----------------------------------------------------

  void Uncharge(Conn& c) {
    buffered_ -= Charged(c.in.capacity);
    buffered_gauge_->Set(static_cast<int64_t>(buffered_));
  }

  // Frees an emptied buffer that grew past the free allowance, returning
  // its charge to the budget and waking connections that waited for it.
  void ReleaseIfEmpty(Conn& c) {
    if (c.in.size != 0 || c.in.capacity <= kFreeBufferBytes) return;
    Uncharge(c);
    c.in.Free();
    ResumeStarved();
  }

  // Room to read into c.in, growing it within the connection's limit (one
  // frame) and the node-wide budget. 0: the budget is spent; c waits.
  size_t MakeRoom(Conn& c) {
    size_t room = c.in.capacity - c.in.size;
    if (room >= kMinRoom) return room;
    const size_t limit = protocol::kHeaderBytes +
                         (c.handshaked ? opts_.max_frame_bytes : protocol::kMaxPreHandshakeFrame);
    size_t want = std::max(c.in.capacity * 2, kInitialBuffer);
    if (c.in.size >= protocol::kHeaderBytes) {
      // The frame's announced length caps growth; the header is checked
      // against the limits when frames are parsed, before any read.
      FrameHeader h;
      if (protocol::DecodeHeader(std::span(c.in.data.get(), protocol::kHeaderBytes),
                                 static_cast<uint32_t>(limit - protocol::kHeaderBytes), &h)
              .ok()) {
        const size_t frame = protocol::kHeaderBytes + h.body_len;
        want = std::max(want, std::min(frame, kEagerBytes));
        want = std::min(want, std::max(frame, c.in.size + kMinRoom));
      }
    }
    want = std::min(want, std::max(limit, c.in.size + kMinRoom));
    if (want <= c.in.capacity) return room;
    const uint64_t extra = Charged(want) - Charged(c.in.capacity);
    if (buffered_ + extra > opts_.max_buffered_bytes) return room;
    buffered_ += extra;
    buffered_gauge_->Set(static_cast<int64_t>(buffered_));
    c.in.Grow(want);
    return c.in.capacity - c.in.size;
  }

  // Lets connections that waited for buffer budget read again (each
  // re-checks; level-triggered epoll reports their pending input).
  void ResumeStarved() {
    if (starved_conns_ == 0) return;
    for (auto& [fd, c] : conns_) {
      if (!c.starved) continue;
      c.starved = false;
      UpdateInterest(c);
    }
    starved_conns_ = 0;
  }

  void UpdateInterest(Conn& c) {
    bool want_out = !c.out.empty();
    bool pause = c.closing || c.pending || c.starved || c.out_bytes > opts_.max_output_bytes;
    if (want_out == c.epollout && pause == c.reading_paused) return;
    c.epollout = want_out;
    c.reading_paused = pause;
    epoll_event ev{};
    uint32_t in = pause ? 0u : static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP);
    ev.events = in | (want_out ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    ev.data.u64 = static_cast<uint64_t>(c.fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  // Reads and handles what the client sent. Returns false when the
  // connection must be closed now.
  bool OnReadable(Conn& c) {
    // Reading stops while a request waits (parked) or replies back up, so
    // the buffer holds at most the frame being received.
    while (!c.closing && !c.pending && c.out_bytes <= opts_.max_output_bytes) {
      const size_t room = std::min(MakeRoom(c), kReadChunk);
      if (room == 0) {
        c.starved = true;
        ++starved_conns_;
        starved_->Inc();
        break;
      }
      ssize_t r = ::read(c.fd, c.in.data.get() + c.in.size, room);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      if (r == 0) {  // the client closed: answer what it sent, then close
        ProcessFrames(c);
        c.closing = true;
        break;
      }
      const auto now = std::chrono::steady_clock::now();
      if (c.in.size == 0) c.frame_start = now;
      c.in.size += static_cast<size_t>(r);
      c.last_active = now;
      ProcessFrames(c);
      if (static_cast<size_t>(r) < room) break;
    }
    ReleaseIfEmpty(c);
    return Flush(c);
  }

  // Parses and handles every complete frame in c.in. Returns false on a
  // framing error (the stream cannot be trusted any more).
  bool ProcessFrames(Conn& c) {
    size_t pos = 0;
    bool ok = true;
    while (!c.pending && c.in.size - pos >= protocol::kHeaderBytes) {
      FrameHeader h;
      uint32_t max_body = c.handshaked ? opts_.max_frame_bytes : protocol::kMaxPreHandshakeFrame;
      Status s = protocol::DecodeHeader(std::span(c.in.data.get() + pos, protocol::kHeaderBytes),
                                        max_body, &h);
      if (!s.ok()) {
        // The stream cannot be trusted past a bad header: answer and close.
        handlers_->ProtocolError(h.magic != protocol::kMagic               ? "bad_magic"
                                 : h.version != protocol::kProtocolVersion ? "bad_version"
                                                                           : "frame_too_large");
        handlers_->QueueError(c, h.request_id, s);
        c.closing = true;
        ok = false;
        break;
      }
      if (c.in.size - pos - protocol::kHeaderBytes < h.body_len) break;  // wait for the body
      std::span<const uint8_t> body(c.in.data.get() + pos + protocol::kHeaderBytes, h.body_len);
      pos += protocol::kHeaderBytes + h.body_len;
      handlers_->Handle(c, h, body);
      if (c.tenant != c.counted_tenant) {  // a tenant token in the hello
        --tenant_conns_[c.counted_tenant];
        ++tenant_conns_[c.tenant];
        c.counted_tenant = c.tenant;
      }
      if (c.closing) break;
      if (c.out_bytes > opts_.max_output_bytes) break;
    }
    handlers_->PublishStored();  // before the replies are written
    if (pos > 0) {
      c.in.Consume(pos);
      // What is left began arriving with the last read: a new frame's clock.
      c.frame_start = std::chrono::steady_clock::now();
    }
    return ok;
  }

  // On the loop: answers parked requests whose waits all finished, then
  // resumes their connections.
  void FinishParked() {
    for (auto& p : handlers_->TakeReady()) {
      auto cit = conns_.find(p.fd);
      if (cit == conns_.end() || cit->second.id != p.conn_id) continue;  // client left
      Conn& c = cit->second;
      handlers_->Resume(c, p);
      ProcessFrames(c);
      ReleaseIfEmpty(c);
      if (!Flush(c)) {
        CloseConn(c.fd);
        continue;
      }
      Settle(c);
    }
  }

  // After a connection was served: closed once a closing one has written
  // everything, else polled for what it waits for now.
  void Settle(Conn& c) {
    if (c.closing && c.out.empty()) {
      CloseConn(c.fd);
    } else {
      UpdateInterest(c);
    }
  }

  // Writes queued output. Returns false on a write error.
  bool Flush(Conn& c) {
    while (!c.out.empty()) {
      auto& f = c.out.front();
      ssize_t w;
      if (c.pass_fds[0] >= 0 && c.out_offset == 0) {
        iovec iov{f.data(), f.size()};
        const int n = c.pass_fds[1] >= 0 ? 2 : 1;
        alignas(cmsghdr) char ctrl[CMSG_SPACE(2 * sizeof(int))] = {};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl;
        msg.msg_controllen = CMSG_SPACE(n * sizeof(int));
        cmsghdr* cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n * sizeof(int));
        std::memcpy(CMSG_DATA(cm), c.pass_fds, n * sizeof(int));
        w = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
        if (w > 0) c.pass_fds[0] = c.pass_fds[1] = -1;
      } else {
        w = ::send(c.fd, f.data() + c.out_offset, f.size() - c.out_offset, MSG_NOSIGNAL);
      }
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        return false;
      }
      c.out_offset += static_cast<size_t>(w);
      c.out_bytes -= static_cast<size_t>(w);
      if (c.out_offset == f.size()) {
        c.out.pop_front();
        c.out_offset = 0;
        if (c.out.empty()) c.last_active = std::chrono::steady_clock::now();
      }
    }
    return true;
  }

  const LocalServerOptions opts_;
  TieredStore* const tiered_;           // outlives the server
  const ClusterFaces cluster_;          // null faces when standalone
  const std::vector<LocalTenant> tenants_;
  std::unique_ptr<std::atomic<int>[]> tenant_conns_;  // [0]: the default tenant
  std::unique_ptr<LocalOps> handlers_;  // created with the wake fd
  // Commits' copies (LocalOps::set_copy_executor); stopped first, so it
  // goes before handlers_ (whose parked requests its jobs write to).
  std::unique_ptr<ThreadPool> copy_pool_;
  MetricsRegistry* metrics_ = nullptr;
  const std::function<std::string()> stats_json_;
  std::string socket_path_;  // resolved at Bind()
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int spare_fd_ = -1;
  uint64_t buffered_ = 0;     // charged request buffer bytes, all connections
  size_t starved_conns_ = 0;  // connections with starved set
  std::atomic<bool> stop_{false};
  std::atomic<int> num_conns_{0};
  // The open connections' records, by connection id (clients()).
  mutable std::mutex clients_mu_;
  std::map<uint64_t, std::shared_ptr<ClientRecord>> clients_;  // clients_mu_
  uint64_t conn_ids_ = 0;
  std::unordered_map<int, Conn> conns_;  // owned by the loop thread
  Gauge* conns_gauge_;
  Counter* accepted_;
  Counter* rejected_;
  enum class ReapReason { kHandshake, kFrame, kIdle };
  static constexpr int kNumReapReasons = 3;
  static constexpr const char* kReapReasonNames[kNumReapReasons] = {"handshake_timeout",
                                                                    "frame_timeout", "idle"};
  Counter* reaped_[kNumReapReasons] = {};
  Counter* refused_[kNumRefusedReasons] = {};
  std::unordered_map<uint32_t, int> uid_conns_;  // open connections per uid; loop thread only
  Gauge* buffered_gauge_;
  Counter* starved_;
};

}  // namespace

int LocalServerOptions::ResolvedCopyThreads() const {
  if (copy_threads >= 0) return copy_threads;
  return std::thread::hardware_concurrency() >= 4 ? 2 : 0;
}

Result<std::unique_ptr<LocalServer>> LocalServer::Open(const LocalServerOptions& options,
                                                       TieredStore* store, ClusterFaces cluster,
                                                       MetricsRegistry* metrics,
                                                       std::function<std::string()> stats_json,
                                                       std::vector<LocalTenant> tenants) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto s = std::make_unique<LocalServerImpl>(options, store, cluster, metrics,
                                             std::move(stats_json), std::move(tenants));
  KVPOOL_RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<LocalServer>(std::move(s));
}

}  // namespace kvpool
