// Node option helpers that read no files: which UCX settings leave UCX's own
// TCP data port unpinned (the node warns at start then; docs/cluster.md,
// "UCX's own port").
#include "node/node_options.h"

#include <gtest/gtest.h>

namespace kvpool {
namespace {

TEST(UcxTcpPortUnpinnedTest, TcpIsPossibleUnlessUcxTlsLeavesItOut) {
  EXPECT_TRUE(UcxTcpPortUnpinned(nullptr, nullptr));  // UCX picks, tcp among them
  EXPECT_TRUE(UcxTcpPortUnpinned("", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("tcp", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("rc,sm,tcp", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("all", nullptr));
  EXPECT_TRUE(UcxTcpPortUnpinned("^rc", nullptr));  // all but rc
  EXPECT_FALSE(UcxTcpPortUnpinned("rc,sm,self", nullptr));
  EXPECT_FALSE(UcxTcpPortUnpinned("^tcp", nullptr));
  EXPECT_FALSE(UcxTcpPortUnpinned("^rc,tcp", nullptr));
}

TEST(UcxTcpPortUnpinnedTest, APortRangePinsIt) {
  EXPECT_FALSE(UcxTcpPortUnpinned("tcp", "7401-7401"));
  EXPECT_FALSE(UcxTcpPortUnpinned(nullptr, "7401-7410"));
  EXPECT_TRUE(UcxTcpPortUnpinned("tcp", "0"));  // UCX's default: the system picks
  EXPECT_TRUE(UcxTcpPortUnpinned("tcp", ""));
}

}  // namespace
}  // namespace kvpool
