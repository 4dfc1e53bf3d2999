#include "client/local_connection.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "client/fork_guard.h"
#include "protocol/socket_path.h"

namespace kvpool {
namespace {

using protocol::FrameHeader;
using protocol::MessageType;

int RemainingMs(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits until fd is ready for `events` or the deadline passes.
Status WaitFd(int fd, short events, SteadyClock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int ms = RemainingMs(deadline);
    int r = ::poll(&p, 1, ms);
    if (r > 0) return Status::Ok();
    if (r == 0) return DeadlineExceeded("the node did not answer in time");
    if (errno != EINTR) return Unavailable(fmt::format("poll: {}", std::strerror(errno)));
  }
}

// A reply with request id 0 that is an error is about the connection
// itself (too many connections, idle, a frame timed out), sent just before
// the node closes it.
constexpr uint32_t kMaxConnectionErrorBytes = 4096;

bool IsConnectionError(const FrameHeader& h) {
  return h.request_id == 0 &&
         h.type == (static_cast<uint16_t>(MessageType::kError) | protocol::kReplyBit);
}

Status ConnectionErrorStatus(const FrameHeader& h, std::span<const uint8_t> body) {
  std::string msg;
  if (!protocol::DecodeString(body, &msg).ok()) msg = "connection closed by the node";
  StatusCode code = IsErrorStatusCode(h.status)
                        ? static_cast<StatusCode>(h.status)
                        : StatusCode::kUnavailable;
  return Status(code, "node: " + msg);
}

// Refuses a server that does not run as one of the expected uids: another
// user could have bound the path (a squatted socket) and would otherwise be
// handed requests and hand back a segment to map.
Status CheckServerCredentials(int fd, const std::string& socket_path,
                              const std::vector<int64_t>& expected) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(fmt::format("SO_PEERCRED on {}", socket_path), errno);
  }
  if (std::find(expected.begin(), expected.end(), static_cast<int64_t>(cred.uid)) !=
      expected.end()) {
    return Status::Ok();
  }
  return FailedPrecondition(fmt::format(
      "refusing the server at {}: it runs as uid {} (pid {}), not the expected uid {}; another "
      "user may have taken the socket's name",
      socket_path, cred.uid, cred.pid, expected.front()));
}

}  // namespace

// The socket was made by OpenForkSafeSocket: the parent's alone after a
// fork (client/fork_guard.h).
LocalConnection::LocalConnection(int fd) : fd_(fd) {}

LocalConnection::~LocalConnection() {
  client::CloseForkSafe(fd_);
  if (segment_fd_ >= 0) ::close(segment_fd_);
  if (staging_fd_ >= 0) ::close(staging_fd_);
}

int LocalConnection::TakeSegmentFd() {
  int fd = segment_fd_;
  segment_fd_ = -1;
  return fd;
}

int LocalConnection::TakeStagingFd() {
  int fd = staging_fd_;
  staging_fd_ = -1;
  return fd;
}

Status LocalConnection::TakeRefusal(Status fallback) {
  if (fd_ < 0) return fallback;
  uint8_t buf[protocol::kHeaderBytes + kMaxConnectionErrorBytes];
  // What the node sent before it closed is still queued on our side.
  ssize_t r = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
  if (r < static_cast<ssize_t>(protocol::kHeaderBytes)) return fallback;
  FrameHeader h;
  if (!protocol::DecodeHeader(std::span(buf, protocol::kHeaderBytes), kMaxConnectionErrorBytes, &h)
           .ok() ||
      !IsConnectionError(h) || h.body_len > static_cast<size_t>(r) - protocol::kHeaderBytes) {
    return fallback;
  }
  return ConnectionErrorStatus(h, std::span(buf + protocol::kHeaderBytes, h.body_len));
}

Status LocalConnection::Break(Status s) {
  client::CloseForkSafe(fd_);
  fd_ = -1;
  return s;
}

Result<std::unique_ptr<LocalConnection>> LocalConnection::Connect(
    const std::string& socket_path, const std::string& client_name,
    SteadyClock::time_point deadline, int64_t expected_server_uid, const TenantToken* token,
    protocol::SocketDirKind dir_kind) {
  // Who may serve this path, judged from its directory before anything is
  // sent (a caller that names the uid has judged it itself).
  std::vector<int64_t> servers = {expected_server_uid};
  if (expected_server_uid == kSocketDirOwner) {
    KVPOOL_ASSIGN_OR_RETURN(servers, protocol::CheckSocketDirForClient(socket_path, dir_kind,
                                                                       ::geteuid()));
  }
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path)) return InvalidArgument("socket path too long");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  int fd = client::OpenForkSafeSocket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoStatus("socket", errno);
  std::unique_ptr<LocalConnection> c(new LocalConnection(fd));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EAGAIN || errno == EINPROGRESS) {
      KVPOOL_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline));
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        return Unavailable(fmt::format("no kvpool node at {}: {}", socket_path, std::strerror(err)));
      }
    } else {
      return Unavailable(fmt::format("no kvpool node at {}: {}", socket_path, std::strerror(errno)));
    }
  }
  KVPOOL_RETURN_IF_ERROR(CheckServerCredentials(fd, socket_path, servers));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));

  std::vector<uint8_t> body;
  protocol::HelloRequest hello;
  hello.client_name = client_name.substr(0, protocol::kMaxClientName);
  if (token != nullptr) {
    hello.has_token = true;
    hello.token_name = token->name;
    hello.token = token->secret;
  }
  protocol::EncodeHello(hello, &body);
  iovec iov{body.data(), body.size()};
  uint64_t id = c->next_request_id_++;
  KVPOOL_RETURN_IF_ERROR(c->WriteFrame(MessageType::kHello, id, std::span(&iov, 1), deadline));
  FrameHeader h;
  std::vector<uint8_t> reply;
  int passed[2] = {-1, -1};
  Status read = c->ReadReply(id, deadline, &h, &reply, passed);
  // Owned by the connection from here, so closed with it on any error.
  c->segment_fd_ = passed[0];
  c->staging_fd_ = passed[1];
  KVPOOL_RETURN_IF_ERROR(read);
  if (h.status != 0) {
    std::string msg;
    protocol::DecodeString(reply, &msg).IgnoreError();
    return Status(static_cast<StatusCode>(h.status), "handshake refused: " + msg);
  }
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHelloReply(reply, &c->hello_));
  return c;
}

Status LocalConnection::WriteFrame(MessageType type, uint64_t request_id,
                                   std::span<const iovec> body, SteadyClock::time_point deadline) {
  if (fd_ < 0) return Unavailable("connection is closed");
  size_t total = 0;
  for (const auto& v : body) total += v.iov_len;
  if (total > UINT32_MAX) return InvalidArgument("request body too large");
  uint8_t header[protocol::kHeaderBytes];
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.request_id = request_id;
  h.body_len = static_cast<uint32_t>(total);
  protocol::EncodeHeader(h, header);

  std::vector<iovec> iovs;
  iovs.reserve(body.size() + 1);
  iovs.push_back({header, sizeof(header)});
  for (const auto& v : body) {
    if (v.iov_len > 0) iovs.push_back(v);
  }
  size_t idx = 0;
  while (idx < iovs.size()) {
    msghdr msg{};
    msg.msg_iov = iovs.data() + idx;
    msg.msg_iovlen = std::min<size_t>(iovs.size() - idx, IOV_MAX);
    ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        Status s = WaitFd(fd_, POLLOUT, deadline);
        if (!s.ok()) return Break(s);
        continue;
      }
      return Break(TakeRefusal(Unavailable(fmt::format("send to node: {}", std::strerror(errno)))));
    }
    size_t n = static_cast<size_t>(w);
    while (n > 0 && idx < iovs.size()) {
      if (n >= iovs[idx].iov_len) {
        n -= iovs[idx].iov_len;
        ++idx;
      } else {
        iovs[idx].iov_base = static_cast<uint8_t*>(iovs[idx].iov_base) + n;
        iovs[idx].iov_len -= n;
        n = 0;
      }
    }
  }
  return Status::Ok();
}

Status LocalConnection::ReadReply(uint64_t request_id, SteadyClock::time_point deadline,
                                  FrameHeader* h, std::vector<uint8_t>* body, int* passed_fds) {
  uint8_t header[protocol::kHeaderBytes];
  size_t got = 0;
  bool spun = false;
  auto read_some = [&](uint8_t* dst, size_t want, bool take_fd) -> Result<size_t> {
    while (true) {
      ssize_t r;
      if (take_fd) {
        iovec iov{dst, want};
        alignas(cmsghdr) char ctrl[CMSG_SPACE(2 * sizeof(int))];
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl;
        msg.msg_controllen = sizeof(ctrl);
        r = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
        if (r > 0) {
          for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
              size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
              for (size_t i = 0; i < n; ++i) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (i >= 2) {
                  ::close(fd);
                  continue;
                }
                if (passed_fds[i] >= 0) ::close(passed_fds[i]);
                passed_fds[i] = fd;
              }
            }
          }
        }
      } else {
        r = ::read(fd_, dst, want);
      }
      if (r > 0) return static_cast<size_t>(r);
      if (r == 0) return Unavailable("the node closed the connection");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // Poll briefly before sleeping: the reply to a small request comes
        // back faster than a sleeping thread wakes up.
        if (spin_.count() > 0 && !spun) {
          spun = true;
          auto until = SteadyClock::now() + spin_;
          while (SteadyClock::now() < until) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 0) > 0) break;
            __builtin_ia32_pause();
          }
          continue;
        }
        KVPOOL_RETURN_IF_ERROR(WaitFd(fd_, POLLIN, deadline));
        continue;
      }
      return Unavailable(fmt::format("read from node: {}", std::strerror(errno)));
    }
  };
  while (got < sizeof(header)) {
    auto n = read_some(header + got, sizeof(header) - got, passed_fds != nullptr);
    if (!n.ok()) return Break(n.status());
    got += *n;
  }
  // Replies may carry a batch of values: the bound is the node's frame limit
  // plus the per-item overhead, and at least what the handshake needs.
  uint32_t max_body = std::max<uint32_t>(hello_.max_frame_bytes, 1u << 20) + (1u << 20);
  Status s = protocol::DecodeHeader(std::span(header, sizeof(header)), max_body, h);
  if (!s.ok()) return Break(Internal("bad reply from node: " + s.ToString()));
  if (IsConnectionError(*h)) {
    // The node refused or closed this connection, and said why.
    std::vector<uint8_t> why(std::min<uint32_t>(h->body_len, kMaxConnectionErrorBytes));
    got = 0;
    while (got < why.size()) {
      auto n = read_some(why.data() + got, why.size() - got, false);
      if (!n.ok()) break;
      got += *n;
    }
    why.resize(got);
    return Break(ConnectionErrorStatus(*h, why));
  }
  if (h->request_id != request_id) {
    return Break(Internal(fmt::format("reply for request {} while waiting for {}", h->request_id,
                                      request_id)));
  }
  body->resize(h->body_len);
  got = 0;
  while (got < h->body_len) {
    auto n = read_some(body->data() + got, h->body_len - got, false);
    if (!n.ok()) return Break(n.status());
    got += *n;
  }
  return Status::Ok();
}

Status LocalConnection::Call(MessageType type, std::span<const iovec> body,
                             SteadyClock::time_point deadline, std::vector<uint8_t>* reply) {
  KVPOOL_ASSIGN_OR_RETURN(uint64_t id, Begin(type, body, deadline));
  return Finish(type, id, deadline, reply);
}

Result<uint64_t> LocalConnection::Begin(MessageType type, std::span<const iovec> body,
                                        SteadyClock::time_point deadline) {
  uint64_t id = next_request_id_++;
  KVPOOL_RETURN_IF_ERROR(WriteFrame(type, id, body, deadline));
  return id;
}

Status LocalConnection::Finish(MessageType type, uint64_t id, SteadyClock::time_point deadline,
                               std::vector<uint8_t>* reply) {
  FrameHeader h;
  KVPOOL_RETURN_IF_ERROR(ReadReply(id, deadline, &h, reply, nullptr));
  uint16_t want = static_cast<uint16_t>(type) | protocol::kReplyBit;
  if (h.type != want) {
    std::string msg;
    if (h.type == (static_cast<uint16_t>(MessageType::kError) | protocol::kReplyBit)) {
      protocol::DecodeString(*reply, &msg).IgnoreError();
      StatusCode code = IsErrorStatusCode(h.status)
                            ? static_cast<StatusCode>(h.status)
                            : StatusCode::kInternal;
      return Status(code, "node: " + msg);
    }
    return Break(Internal(fmt::format("unexpected reply type {:#x}", h.type)));
  }
  if (h.status != 0) {
    StatusCode code = IsErrorStatusCode(h.status)
                          ? static_cast<StatusCode>(h.status)
                          : StatusCode::kInternal;
    return Status(code, "node refused the request");
  }
  return Status::Ok();
}

Status LocalConnection::Send(MessageType type, std::span<const iovec> body,
                             SteadyClock::time_point deadline) {
  return WriteFrame(type, next_request_id_++, body, deadline);
}

}  // namespace kvpool
