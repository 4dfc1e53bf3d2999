// Clock: the time a component reads where elapsed time decides what it does
// (a peer's cool-down, a cache entry's TTL). Production code uses
// SystemClock (std::chrono::steady_clock); tests use ManualClock, which
// moves only when told, so such a decision is exact and needs no sleep.
// Deadlines handed to the transport stay on steady_clock: they bound real
// waits. In kvpool `Clock` names this interface only; a file that reads
// steady_clock itself calls its alias SteadyClock.
//
// Thread-safe: every method may be called from any thread. The pointer
// SystemClock::Get() returns lives for the whole process.
#pragma once

#include <chrono>
#include <mutex>

#include "common/thread_annotations.h"

namespace kvpool {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual time_point Now() const = 0;
};

// steady_clock.
class SystemClock final : public Clock {
 public:
  static const Clock* Get() {
    static const SystemClock clock;
    return &clock;
  }
  time_point Now() const override { return std::chrono::steady_clock::now(); }
};

// A clock for tests: starts at `start` and moves only by Advance().
class ManualClock final : public Clock {
 public:
  explicit ManualClock(time_point start = std::chrono::steady_clock::now()) : now_(start) {}
  time_point Now() const override {
    std::lock_guard lock(mu_);
    return now_;
  }
  // REQUIRES: d >= 0 (time does not run backwards).
  void Advance(duration d) {
    std::lock_guard lock(mu_);
    if (d > duration::zero()) now_ += d;
  }

 private:
  mutable std::mutex mu_;
  time_point now_;  // protected by mu_ (std::mutex carries no capability annotation)
};

}  // namespace kvpool
