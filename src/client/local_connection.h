// LocalConnection: one client connection to the node's Unix socket, with
// the handshake (which hands over the segment fd) and request/reply calls
// bounded by a deadline. Not thread-safe; owned by one caller at a time (the
// client's connection pool lends it out).
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "protocol/codec.h"
#include "protocol/socket_path.h"

namespace kvpool {

using SteadyClock = std::chrono::steady_clock;

class LocalConnection {
 public:
  // The uid the server must run as: kSocketDirOwner is what the socket's
  // directory promises (protocol::CheckSocketDirForClient: this user for a
  // private directory; the directory's owner, or root, for a shared one),
  // checked before connecting.
  static constexpr int64_t kSocketDirOwner = -1;

  // Connects, checks the socket's directory (kSocketDirOwner; `dir_kind`:
  // whether it is one of this user's own default directories) and the server's
  // credentials (SO_PEERCRED) before sending
  // or taking anything, and completes the handshake. Unavailable when no
  // node listens, FailedPrecondition when the process behind the socket is
  // not the expected uid, DeadlineExceeded when it does not answer in time,
  // and the node's own status when it refuses the connection
  // (ResourceExhausted: too many connections).
  // A tenant token presented in the handshake (kvpool_options.tenant_token_file).
  struct TenantToken {
    std::string name;
    std::array<uint8_t, 32> secret{};
  };
  static Result<std::unique_ptr<LocalConnection>> Connect(
      const std::string& socket_path, const std::string& client_name,
      SteadyClock::time_point deadline, int64_t expected_server_uid = kSocketDirOwner,
      const TenantToken* token = nullptr,
      protocol::SocketDirKind dir_kind = protocol::SocketDirKind::kShared);
  ~LocalConnection();
  LocalConnection(const LocalConnection&) = delete;
  LocalConnection& operator=(const LocalConnection&) = delete;

  const protocol::HelloReply& hello() const { return hello_; }
  // The segment fd received in the handshake; the caller owns it. -1 after.
  int TakeSegmentFd();
  // The staging area's fd (hello().staging_bytes > 0); the caller owns it.
  int TakeStagingFd();

  // Sends a request whose body is the concatenation of `body` and waits for
  // its reply. A transport failure or timeout breaks the connection
  // (Unavailable / DeadlineExceeded); an error reply returns its status and
  // leaves the connection usable.
  Status Call(protocol::MessageType type, std::span<const iovec> body,
              SteadyClock::time_point deadline, std::vector<uint8_t>* reply);
  // Call in two halves, so several requests can be in flight: Begin sends
  // one and returns its id; Finish waits for that id's reply. The node
  // answers in order, so requests must be finished in the order begun.
  Result<uint64_t> Begin(protocol::MessageType type, std::span<const iovec> body,
                         SteadyClock::time_point deadline);
  Status Finish(protocol::MessageType type, uint64_t id, SteadyClock::time_point deadline,
                std::vector<uint8_t>* reply);
  // Sends a request that has no reply (release, abort).
  Status Send(protocol::MessageType type, std::span<const iovec> body,
              SteadyClock::time_point deadline);
  bool broken() const { return fd_ < 0; }
  // How long a reply is polled for before the caller sleeps in poll(2).
  void set_spin(std::chrono::microseconds spin) { spin_ = spin; }

 private:
  explicit LocalConnection(int fd);
  Status WriteFrame(protocol::MessageType type, uint64_t request_id, std::span<const iovec> body,
                    SteadyClock::time_point deadline);
  Status ReadReply(uint64_t request_id, SteadyClock::time_point deadline, protocol::FrameHeader* h,
                   std::vector<uint8_t>* body, int* passed_fds);
  Status Break(Status s);
  // After a failed send: the node may have refused the connection (a
  // connection-level error reply, request id 0) before closing it. Returns
  // that status, or `fallback` when there is none.
  Status TakeRefusal(Status fallback);

  int fd_;
  int segment_fd_ = -1;
  int staging_fd_ = -1;
  uint64_t next_request_id_ = 1;
  std::chrono::microseconds spin_{0};
  protocol::HelloReply hello_;
};

}  // namespace kvpool
