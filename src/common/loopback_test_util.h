// Test support: loopback TCP ports and connections, for tests of the servers
// (admin HTTP, peer port, node) and the test etcd.
//
// Thread-safe (FreePort's one counter is atomic).

#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

namespace kvpool::testing {

// Whether 127.0.0.1:port can be bound now (bound and released).
inline bool LoopbackPortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A free loopback TCP port (bound and released: a small race with other
// processes, which a caller that must win covers by retrying); 0 when none
// could be had. Taken below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), from a point that differs per process
// and moves on each call: a port from bind(0) is an ephemeral one, which
// any connection made by a test running beside this one (the kernel picks
// its local port from that range) could take before the server binds it.
// Falls back to bind(0) when the range leaves no room below it.
inline int FreePort() {
  static std::atomic<uint32_t> next{static_cast<uint32_t>(::getpid()) * 7919u};
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  constexpr int kFirst = 10000;
  if (low > kFirst + 1000) {
    const uint32_t span = static_cast<uint32_t>(low - kFirst);
    for (int tries = 0; tries < 200; ++tries) {
      const int port = kFirst + static_cast<int>(next.fetch_add(1) % span);
      if (LoopbackPortFree(port)) return port;
    }
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// A blocking TCP connection to 127.0.0.1:port (close-on-exec); -1 on failure.
inline int DialLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace kvpool::testing
