#include "store/ssd/memory_device.h"

#include <cstring>

namespace kvpool {
namespace {

class MemoryDevice final : public Device {
 public:
  explicit MemoryDevice(std::shared_ptr<std::vector<uint8_t>> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_->size(); }
  Status Read(uint64_t offset, void* buf, uint64_t len) override {
    KVPOOL_CHECK(offset % kDeviceBlock == 0 && len % kDeviceBlock == 0 && offset + len <= size());
    std::lock_guard lock(mu_);  // keeps concurrent overlapping I/O race-free
    std::memcpy(buf, bytes_->data() + offset, len);
    return Status::Ok();
  }
  Status Write(uint64_t offset, const void* buf, uint64_t len) override {
    KVPOOL_CHECK(offset % kDeviceBlock == 0 && len % kDeviceBlock == 0 && offset + len <= size());
    std::lock_guard lock(mu_);
    std::memcpy(bytes_->data() + offset, buf, len);
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  std::string kind() const override { return "memory"; }

 private:
  std::mutex mu_;
  std::shared_ptr<std::vector<uint8_t>> bytes_;
};

}  // namespace

DeviceFactory MemoryDisk::Factory() {
  return [this](const std::string& path, uint64_t size) -> Result<std::unique_ptr<Device>> {
    if (size == 0 || size % kDeviceBlock != 0) return InvalidArgument("size not block-aligned");
    std::lock_guard lock(mu_);
    auto& f = files_[path];
    if (!f) f = std::make_shared<std::vector<uint8_t>>();
    if (f->size() != size) f->resize(size, 0);
    return std::unique_ptr<Device>(new MemoryDevice(f));
  };
}

std::vector<uint8_t>* MemoryDisk::File(const std::string& path) {
  std::lock_guard lock(mu_);
  auto it = files_.find(path);
  return it == files_.end() ? nullptr : it->second.get();
}

std::vector<std::string> MemoryDisk::Paths() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [p, f] : files_) out.push_back(p);
  return out;
}

}  // namespace kvpool
