#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kvpool {

Status NotifyServiceManager(const char* name, std::string_view state) {
  if (name == nullptr || name[0] == '\0') return Status::Ok();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(name);
  if ((name[0] != '/' && name[0] != '@') || len >= sizeof(addr.sun_path)) {
    return InvalidArgument("NOTIFY_SOCKET is neither a path nor an abstract name that fits");
  }
  std::memcpy(addr.sun_path, name, len);
  if (name[0] == '@') addr.sun_path[0] = '\0';  // abstract: no trailing NUL counted
  const socklen_t addr_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len + (name[0] == '/' ? 1 : 0));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("socket (NOTIFY_SOCKET)", errno);
  const ssize_t n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                             reinterpret_cast<const sockaddr*>(&addr), addr_len);
  const int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus("sendto NOTIFY_SOCKET", err);
  return Status::Ok();
}

}  // namespace kvpool
