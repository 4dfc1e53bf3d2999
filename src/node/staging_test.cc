#include "node/staging.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace kvpool {
namespace {

TEST(StagingAreaTest, AllocatesFirstFitAndCoalescesFreedRanges) {
  auto s = StagingArea::Create(4096);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  StagingArea& a = **s;
  EXPECT_EQ(a.size(), 4096u);
  uint64_t x = a.Allocate(1000);  // rounded to 1024
  uint64_t y = a.Allocate(1024);
  uint64_t z = a.Allocate(2048);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 1024u);
  EXPECT_EQ(z, 2048u);
  EXPECT_EQ(a.Allocate(1), StagingArea::kNone);  // full
  a.Free(x, 1000);
  a.Free(z, 2048);
  EXPECT_EQ(a.Allocate(2049), StagingArea::kNone);  // 1024 + 2048 free, not adjacent
  a.Free(y, 1024);  // joins both neighbours
  EXPECT_EQ(a.free_bytes(), 4096u);
  EXPECT_EQ(a.Allocate(4096), 0u);
}

TEST(StagingAreaTest, ClientWritesAreSeenByTheNodeAndTheSizeIsSealed) {
  auto s = StagingArea::Create(1 << 20);
  ASSERT_TRUE(s.ok());
  int fd = (*s)->fd();
  void* p = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  uint64_t off = (*s)->Allocate(100);
  std::memcpy(static_cast<uint8_t*>(p) + off, "written by the client", 21);
  EXPECT_EQ(std::memcmp((*s)->data(off), "written by the client", 21), 0);
  EXPECT_NE(ftruncate(fd, 4096), 0);  // a client cannot shrink it under the node's copy
  munmap(p, 1 << 20);
}

}  // namespace
}  // namespace kvpool
