// FaultDevice: wraps a Device and injects faults, set at runtime from any
// thread (docs/reliability.md, "Fault-injection seams"): EIO on reads or writes with a
// probability, bit flips in data read, torn writes (only a prefix of each
// write reaches the device), added latency, a full disk (writes fail with
// ENOSPC once a byte budget is spent), and a power cut (undo every write not
// yet covered by a Sync). FaultInjector holds the knobs and can be shared by
// all the devices of a store. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "store/ssd/device.h"

namespace kvpool {

class FaultInjector {
 public:
  explicit FaultInjector(uint64_t seed = 1) : rng_(seed) {}

  // Probabilities in [0, 1].
  void SetReadErrorProbability(double p) { read_eio_.store(p); }
  void SetWriteErrorProbability(double p) { write_eio_.store(p); }
  // Flips one random bit of the data a read returns, with probability p.
  void SetBitFlipProbability(double p) { flip_.store(p); }
  // Only the first `bytes` (rounded down to 4 KiB) of each write reach the
  // device, which still reports success. 0: off.
  void SetTornWriteBytes(uint64_t bytes) { torn_bytes_.store(bytes); }
  void SetLatencyMicros(uint32_t us) { latency_us_.store(us); }
  // Writes fail with ENOSPC once `bytes` more have been written (a write
  // that does not fit fails whole). UINT64_MAX: unlimited (the default).
  void SetSpaceLeft(uint64_t bytes) { space_left_.store(bytes); }
  // Remember writes not yet synced, so PowerCut() can undo them. Costs a
  // read of the old contents per write while on.
  void SetTrackUnsynced(bool on) { track_.store(on); }

  uint64_t read_errors() const { return read_errors_.load(); }
  uint64_t write_errors() const { return write_errors_.load(); }
  uint64_t bit_flips() const { return flips_.load(); }
  uint64_t enospc_errors() const { return enospc_.load(); }

  // Restores, on every device made with this injector (even ones already
  // closed), what each unsynced write overwrote, newest first: as if the
  // power failed. Requires SetTrackUnsynced(true) before those writes.
  Status PowerCut();

 private:
  friend class FaultDevice;
  struct Undo {
    uint64_t offset;
    std::vector<uint8_t> old;
  };
  // A device's unsynced writes; outlives the FaultDevice so a power cut can
  // be applied after the store dropped its devices.
  struct Tracked {
    std::shared_ptr<Device> inner;
    std::mutex mu;
    std::vector<Undo> undo;  // protected by mu
  };
  std::shared_ptr<Tracked> Track(std::shared_ptr<Device> inner);
  bool Roll(double p);
  uint64_t Random(uint64_t n);

  std::atomic<double> read_eio_{0}, write_eio_{0}, flip_{0};
  std::atomic<uint64_t> torn_bytes_{0};
  std::atomic<uint32_t> latency_us_{0};
  std::atomic<uint64_t> space_left_{UINT64_MAX};
  std::atomic<bool> track_{false};
  std::atomic<uint64_t> read_errors_{0}, write_errors_{0}, flips_{0}, enospc_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // protected by rng_mu_
  std::mutex tracked_mu_;
  std::vector<std::shared_ptr<Tracked>> tracked_;  // protected by tracked_mu_
};

class FaultDevice final : public Device {
 public:
  FaultDevice(std::unique_ptr<Device> inner, std::shared_ptr<FaultInjector> faults);

  // Wraps every device `inner` makes.
  static DeviceFactory Wrap(DeviceFactory inner, std::shared_ptr<FaultInjector> faults);

  uint64_t size() const override { return inner_->size(); }
  Status Read(uint64_t offset, void* buf, uint64_t len) override;
  Status Write(uint64_t offset, const void* buf, uint64_t len) override;
  Status Sync() override;
  std::string kind() const override { return "fault+" + inner_->kind(); }

 private:
  std::shared_ptr<Device> inner_;
  std::shared_ptr<FaultInjector> faults_;
  std::shared_ptr<FaultInjector::Tracked> tracked_;
};

}  // namespace kvpool
