// The descriptors a single-threaded epoll server loop keeps besides its
// connections: the epoll instance, an eventfd that wakes the loop from other
// threads, the listener, and a spare descriptor held open so that, out of
// descriptors, the loop can still take a connection off the backlog to
// refuse it instead of spinning on a readable listener. Used by the admin
// HTTP server and the node's local socket server, which own the plain ints
// these functions fill, watch and close.
//
// Thread-safe: plain functions over descriptors; SignalEventFd may be called
// from any thread, the rest from the loop's owner.

#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string_view>

#include "common/status.h"

namespace kvpool {

// Opens an epoll instance, a non-blocking eventfd and the spare descriptor
// (/dev/null), all close-on-exec; `who` prefixes an error's message ("admin"
// gives "admin: epoll_create1: ..."). A spare descriptor that cannot be opened
// is left at -1 (the loop then refuses nothing when out of descriptors). The
// caller closes what was opened, also on failure (CloseFds).
Status OpenEventLoopFds(std::string_view who, int* epoll_fd, int* wake_fd, int* spare_fd);

// Adds the listener and the wake eventfd to the epoll instance, both readable,
// with the tags the loop tells them apart by.
void WatchListenerAndWake(int epoll_fd, int listen_fd, uint64_t listen_tag, int wake_fd,
                          uint64_t wake_tag);

// Wakes the loop (adds 1 to the eventfd) / takes the wake-ups (reads it).
void SignalEventFd(int fd);
void DrainEventFd(int fd);

// For an accept that failed with EMFILE or ENFILE: closes the spare
// descriptor, takes one waiting connection off the listener's backlog, calls
// `tell` on it (if set; e.g. to send a short error), closes it, and opens the
// spare again. Returns whether a connection was taken (false: no spare, or
// nothing waiting). The listener then does not stay readable and spin the loop.
bool RefuseWithSpareFd(int listen_fd, int* spare_fd, const std::function<void(int fd)>& tell);

// Closes each open (non-negative) descriptor.
void CloseFds(std::initializer_list<int> fds);

}  // namespace kvpool
