#include "common/event_loop_fds.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace kvpool {
namespace {

std::string Context(std::string_view who, std::string_view call) {
  if (who.empty()) return std::string(call);
  return std::string(who) + ": " + std::string(call);
}

int OpenSpare() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

Status OpenEventLoopFds(std::string_view who, int* epoll_fd, int* wake_fd, int* spare_fd) {
  *epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (*epoll_fd < 0) return ErrnoStatus(Context(who, "epoll_create1"), errno);
  *wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (*wake_fd < 0) return ErrnoStatus(Context(who, "eventfd"), errno);
  *spare_fd = OpenSpare();
  return Status::Ok();
}

void WatchListenerAndWake(int epoll_fd, int listen_fd, uint64_t listen_tag, int wake_fd,
                          uint64_t wake_tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listen_tag;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
  ev.data.u64 = wake_tag;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev);
}

void SignalEventFd(int fd) {
  uint64_t one = 1;
  ssize_t r = ::write(fd, &one, sizeof(one));
  (void)r;
}

void DrainEventFd(int fd) {
  uint64_t v;
  ssize_t r = ::read(fd, &v, sizeof(v));
  (void)r;
}

bool RefuseWithSpareFd(int listen_fd, int* spare_fd, const std::function<void(int fd)>& tell) {
  if (*spare_fd < 0) return false;
  ::close(*spare_fd);
  int taken = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (taken >= 0) {
    if (tell) tell(taken);
    ::close(taken);
  }
  *spare_fd = OpenSpare();
  return taken >= 0;
}

void CloseFds(std::initializer_list<int> fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace kvpool
