// FreePort: a bindable loopback port below the kernel's ephemeral range, a
// different one on each call.
#include "common/loopback_test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>

namespace kvpool::testing {
namespace {

TEST(FreePort, BelowTheEphemeralRangeBindableAndNewEachCall) {
  int low = 0;
  FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fscanf(f, "%d", &low), 1);
  std::fclose(f);
  std::set<int> seen;
  for (int i = 0; i < 50; ++i) {
    const int port = FreePort();
    ASSERT_GT(port, 0);
    if (low > 11000) {
      EXPECT_GE(port, 10000);
      EXPECT_LT(port, low);  // not one a connection's local port could take
    }
    EXPECT_TRUE(LoopbackPortFree(port)) << port;
    EXPECT_TRUE(seen.insert(port).second) << port;
  }
}

TEST(FreePort, APortInUseIsNotFree) {
  const int port = FreePort();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_FALSE(LoopbackPortFree(port));
  ::close(fd);
  EXPECT_TRUE(LoopbackPortFree(port));
}

}  // namespace
}  // namespace kvpool::testing
