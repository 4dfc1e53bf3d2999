// Gate: how a component stops. Work that must not outlive the component
// (a queued task, a callback from another thread) enters the gate before it
// runs and leaves it after; Close() turns new entries away and waits until
// the running ones have left. Long work checks closed() between steps.
//
// Thread-safe. Close() must not be called from inside the gate. Work queued
// on executors that may run after the component is gone holds the gate by
// shared_ptr (see Shared()).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace kvpool {

class Gate {
 public:
  // False once closed: the caller skips its work.
  bool Enter() {
    std::lock_guard lock(mu_);
    if (closed_.load(std::memory_order_relaxed)) return false;
    ++running_;
    return true;
  }
  void Leave() {
    std::lock_guard lock(mu_);
    if (--running_ == 0) idle_.notify_all();
  }
  // Refuses new entries, then waits for the running ones. Idempotent.
  void Close() {
    std::unique_lock lock(mu_);
    closed_.store(true);
    idle_.wait(lock, [&] { return running_ == 0; });
  }
  bool closed() const { return closed_.load(); }

  // Runs fn inside the gate; false (fn not run) once closed.
  template <typename Fn>
  bool Run(Fn&& fn) {
    if (!Enter()) return false;
    fn();
    Leave();
    return true;
  }

  static std::shared_ptr<Gate> Shared() { return std::make_shared<Gate>(); }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  std::atomic<bool> closed_{false};
  uint64_t running_ = 0;  // protected by mu_
};

}  // namespace kvpool
