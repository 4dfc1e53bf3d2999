#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "store/ssd/fault_device.h"
#include "store/ssd/file_device.h"
#include "store/ssd/memory_device.h"

namespace kvpool {
namespace {

struct Aligned {
  explicit Aligned(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, n))), n(n) {}
  ~Aligned() { std::free(p); }
  uint8_t* p;
  size_t n;
};

std::string TempDir(const std::string& base) {
  std::string t = base + "/kvpool_dev_XXXXXX";
  char* d = mkdtemp(t.data());
  EXPECT_NE(d, nullptr);
  return t;
}

void RoundTrip(Device& dev) {
  Aligned w(3 << 20), r(3 << 20);
  for (size_t i = 0; i < w.n; ++i) w.p[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(dev.Write(4096, w.p, w.n).ok());
  ASSERT_TRUE(dev.Sync().ok());
  std::memset(r.p, 0, r.n);
  ASSERT_TRUE(dev.Read(4096, r.p, r.n).ok());
  EXPECT_EQ(std::memcmp(w.p, r.p, w.n), 0);
}

TEST(FileDeviceTest, IoUringDirectRoundTrip) {
  std::string dir = TempDir("/tmp");
  auto dev = FileDeviceFactory()(dir + "/f", 8 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->size(), 8u << 20);
  RoundTrip(**dev);
  std::filesystem::remove_all(dir);
}

TEST(FileDeviceTest, PreadFallbackRoundTrip) {
  std::string dir = TempDir("/tmp");
  FileDeviceOptions o;
  o.use_io_uring = false;
  auto dev = FileDeviceFactory(o)(dir + "/f", 8 << 20);
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ((*dev)->kind().rfind("pread", 0), 0u) << (*dev)->kind();
  RoundTrip(**dev);
  std::filesystem::remove_all(dir);
}

// tmpfs refuses O_DIRECT before Linux 6.6 (then the device falls back to
// buffered I/O) and accepts it since; either way the device must work.
TEST(FileDeviceTest, TmpfsWorksWithOrWithoutODirect) {
  if (!std::filesystem::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  std::string dir = TempDir("/dev/shm");
  auto dev = FileDeviceFactory()(dir + "/f", 8 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  RoundTrip(**dev);
  std::filesystem::remove_all(dir);
}

TEST(FaultDeviceTest, ErrorsFlipsTornWritesAndFullDisk) {
  MemoryDisk disk;
  auto faults = std::make_shared<FaultInjector>();
  auto dev = FaultDevice::Wrap(disk.Factory(), faults)("/m", 1 << 20);
  ASSERT_TRUE(dev.ok());
  Aligned b(64 << 10), r(64 << 10);
  std::memset(b.p, 0xAB, b.n);
  faults->SetWriteErrorProbability(1);
  EXPECT_EQ((*dev)->Write(0, b.p, b.n).code(), StatusCode::kIOError);
  faults->SetWriteErrorProbability(0);
  faults->SetSpaceLeft(32 << 10);
  EXPECT_EQ((*dev)->Write(0, b.p, b.n).code(), StatusCode::kResourceExhausted);
  faults->SetSpaceLeft(UINT64_MAX);
  faults->SetTornWriteBytes(8 << 10);
  ASSERT_TRUE((*dev)->Write(0, b.p, b.n).ok());
  faults->SetTornWriteBytes(0);
  ASSERT_TRUE((*dev)->Read(0, r.p, r.n).ok());
  EXPECT_EQ(r.p[(8 << 10) - 1], 0xAB);
  EXPECT_EQ(r.p[8 << 10], 0);  // never reached the device
  faults->SetBitFlipProbability(1);
  ASSERT_TRUE((*dev)->Read(0, r.p, 8 << 10).ok());
  int diff = 0;
  for (int i = 0; i < (8 << 10); ++i) diff += __builtin_popcount(r.p[i] ^ 0xAB);
  EXPECT_EQ(diff, 1);
  faults->SetBitFlipProbability(0);
  faults->SetReadErrorProbability(1);
  EXPECT_FALSE((*dev)->Read(0, r.p, 4096).ok());
  EXPECT_EQ(faults->read_errors(), 1u);
}

TEST(FaultDeviceTest, PowerCutUndoesUnsyncedWritesOnly) {
  MemoryDisk disk;
  auto faults = std::make_shared<FaultInjector>();
  faults->SetTrackUnsynced(true);
  {
    auto dev = FaultDevice::Wrap(disk.Factory(), faults)("/m", 1 << 20);
    ASSERT_TRUE(dev.ok());
    Aligned b(4096);
    std::memset(b.p, 1, 4096);
    ASSERT_TRUE((*dev)->Write(0, b.p, 4096).ok());
    ASSERT_TRUE((*dev)->Sync().ok());
    std::memset(b.p, 2, 4096);
    ASSERT_TRUE((*dev)->Write(0, b.p, 4096).ok());
    ASSERT_TRUE((*dev)->Write(8192, b.p, 4096).ok());
  }  // the device is gone; the cut still applies
  ASSERT_TRUE(faults->PowerCut().ok());
  auto& f = *disk.File("/m");
  EXPECT_EQ(f[0], 1);
  EXPECT_EQ(f[8192], 0);
}

}  // namespace
}  // namespace kvpool
