// ManualScheduler: the Scheduler of tests. Its clock is a ManualClock that
// moves only when told, and a job runs only when the test runs it, on the
// test's thread: timed logic (a flush schedule, rounds, retries, leases) is
// stepped through exactly, with no sleep.
#pragma once

#include <cstddef>
#include <functional>

#include "common/clock.h"
#include "common/scheduler.h"

namespace kvpool::testing {

class ManualScheduler final : public Scheduler {
 public:
  ManualScheduler() : queue_(&clock_) {}
  ~ManualScheduler() override { queue_.Close(); }

  const Clock* clock() const override { return &clock_; }
  ManualClock* manual_clock() { return &clock_; }
  JobId RunAfter(Clock::duration delay, std::function<void()> fn) override {
    return queue_.Add(delay, Clock::duration::zero(), std::move(fn));
  }
  JobId RunEvery(Clock::duration every, std::function<void()> fn,
                 Clock::duration first = Clock::duration::zero()) override {
    return queue_.Add(first, every, std::move(fn));
  }
  void Cancel(JobId id) override { queue_.Cancel(id); }

  // Moves the clock to the earliest job's time (when later than now) and
  // runs that job. False when no job is queued.
  bool RunNext() {
    Clock::time_point due;
    if (!queue_.NextDue(&due)) return false;
    if (due > clock_.Now()) clock_.Advance(due - clock_.Now());
    return queue_.RunOneDue();
  }
  // Moves the clock forward by d, running each job that comes due on the
  // way at its time, in order. Returns how many ran.
  size_t Advance(Clock::duration d) {
    const Clock::time_point end = clock_.Now() + d;
    size_t ran = 0;
    Clock::time_point due;
    while (queue_.NextDue(&due) && due <= end) {
      if (due > clock_.Now()) clock_.Advance(due - clock_.Now());
      ran += queue_.RunOneDue() ? 1 : 0;
    }
    if (end > clock_.Now()) clock_.Advance(end - clock_.Now());
    return ran;
  }
  // When the next job is due; false when none is queued.
  bool NextDue(Clock::time_point* due) const { return queue_.NextDue(due); }

 private:
  ManualClock clock_;
  JobQueue queue_;
};

}  // namespace kvpool::testing
