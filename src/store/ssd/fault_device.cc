#include "store/ssd/fault_device.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace kvpool {

bool FaultInjector::Roll(double p) {
  if (p <= 0) return false;
  if (p >= 1) return true;
  std::lock_guard lock(rng_mu_);
  return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
}

uint64_t FaultInjector::Random(uint64_t n) {
  std::lock_guard lock(rng_mu_);
  return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_);
}

DeviceFactory FaultDevice::Wrap(DeviceFactory inner, std::shared_ptr<FaultInjector> faults) {
  return [inner = std::move(inner), faults](const std::string& path,
                                            uint64_t size) -> Result<std::unique_ptr<Device>> {
    KVPOOL_ASSIGN_OR_RETURN(auto dev, inner(path, size));
    return std::unique_ptr<Device>(new FaultDevice(std::move(dev), faults));
  };
}

Status FaultDevice::Read(uint64_t offset, void* buf, uint64_t len) {
  if (uint32_t us = faults_->latency_us_.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  if (faults_->Roll(faults_->read_eio_.load())) {
    faults_->read_errors_.fetch_add(1);
    return ErrnoStatus("injected read error", EIO);
  }
  KVPOOL_RETURN_IF_ERROR(inner_->Read(offset, buf, len));
  if (len > 0 && faults_->Roll(faults_->flip_.load())) {
    uint64_t bit = faults_->Random(len * 8);
    static_cast<uint8_t*>(buf)[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    faults_->flips_.fetch_add(1);
  }
  return Status::Ok();
}

Status FaultDevice::Write(uint64_t offset, const void* buf, uint64_t len) {
  if (uint32_t us = faults_->latency_us_.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  if (faults_->Roll(faults_->write_eio_.load())) {
    faults_->write_errors_.fetch_add(1);
    return ErrnoStatus("injected write error", EIO);
  }
  uint64_t left = faults_->space_left_.load();
  while (left != UINT64_MAX) {
    if (left < len) {
      faults_->enospc_.fetch_add(1);
      return ResourceExhausted("injected full disk: no space left on device");
    }
    if (faults_->space_left_.compare_exchange_weak(left, left - len)) break;
  }
  uint64_t n = len;
  if (uint64_t torn = faults_->torn_bytes_.load(); torn > 0 && torn < len) {
    n = torn / kDeviceBlock * kDeviceBlock;
  }
  if (n == 0) return Status::Ok();
  if (faults_->track_.load()) {
    // Save what the write overwrites, read through an aligned buffer
    // (O_DIRECT inner devices need one).
    FaultInjector::Undo u{offset, std::vector<uint8_t>(n)};
    void* tmp = std::aligned_alloc(kDeviceBlock, n);
    KVPOOL_CHECK(tmp != nullptr);
    Status st = inner_->Read(offset, tmp, n);
    if (st.ok()) std::memcpy(u.old.data(), tmp, n);
    std::free(tmp);
    KVPOOL_RETURN_IF_ERROR(st);
    std::lock_guard lock(tracked_->mu);
    tracked_->undo.push_back(std::move(u));
  }
  return inner_->Write(offset, buf, n);
}

Status FaultDevice::Sync() {
  KVPOOL_RETURN_IF_ERROR(inner_->Sync());
  std::lock_guard lock(tracked_->mu);
  tracked_->undo.clear();
  return Status::Ok();
}

FaultDevice::FaultDevice(std::unique_ptr<Device> inner, std::shared_ptr<FaultInjector> faults)
    : inner_(std::move(inner)), faults_(std::move(faults)), tracked_(faults_->Track(inner_)) {}

std::shared_ptr<FaultInjector::Tracked> FaultInjector::Track(std::shared_ptr<Device> inner) {
  auto t = std::make_shared<Tracked>();
  t->inner = std::move(inner);
  std::lock_guard lock(tracked_mu_);
  tracked_.push_back(t);
  return t;
}

Status FaultInjector::PowerCut() {
  std::lock_guard lock(tracked_mu_);
  for (auto& t : tracked_) {
    std::lock_guard tl(t->mu);
    for (auto it = t->undo.rbegin(); it != t->undo.rend(); ++it) {
      void* tmp = std::aligned_alloc(kDeviceBlock, it->old.size());
      KVPOOL_CHECK(tmp != nullptr);
      std::memcpy(tmp, it->old.data(), it->old.size());
      Status st = t->inner->Write(it->offset, tmp, it->old.size());
      std::free(tmp);
      KVPOOL_RETURN_IF_ERROR(st);
    }
    t->undo.clear();
  }
  return Status::Ok();
}

}  // namespace kvpool
