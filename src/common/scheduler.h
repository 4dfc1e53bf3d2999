// Scheduler: where components run timed work -- a job once after a delay,
// or every interval -- instead of starting a timer thread of their own. The
// time is a Clock's. ThreadScheduler runs jobs on one thread of its own, by
// steady_clock; testing::ManualScheduler (src/testing/) runs a job only when
// a test says so, its ManualClock moved to the job's time, so timed logic is
// tested without sleeping.
//
// Jobs of one scheduler run one at a time, in due order; a job that takes
// long delays the others (give such work a scheduler, or an executor, of its
// own). A periodic job's next run is `every` after its run ended: it never
// overlaps itself.
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "common/clock.h"

namespace kvpool {

class Scheduler {
 public:
  using JobId = uint64_t;
  virtual ~Scheduler() = default;
  // The clock jobs are due by.
  virtual const Clock* clock() const = 0;
  // Runs fn once, `delay` from now.
  virtual JobId RunAfter(Clock::duration delay, std::function<void()> fn) = 0;
  // Runs fn `first` from now, then `every` after each run ended.
  // REQUIRES: every > 0.
  virtual JobId RunEvery(Clock::duration every, std::function<void()> fn,
                         Clock::duration first = Clock::duration::zero()) = 0;
  // The job will not run again; when called from another thread than the
  // job's, it is not running either when this returns. Unknown ids (done,
  // cancelled) are ignored.
  virtual void Cancel(JobId id) = 0;
};

// The jobs of a scheduler and their times, by `clock`: what ThreadScheduler
// and the manual twin share. Not a Scheduler itself; thread-safe.
class JobQueue {
 public:
  explicit JobQueue(const Clock* clock) : clock_(clock) {}
  const Clock* clock() const { return clock_; }
  // 0 when closed.
  Scheduler::JobId Add(Clock::duration delay, Clock::duration every, std::function<void()> fn);
  // Scheduler::Cancel.
  void Cancel(Scheduler::JobId id);
  // Runs the earliest job if it is due by the clock; true when one ran.
  bool RunOneDue();
  // The earliest job's due time; false when there is none.
  bool NextDue(Clock::time_point* due) const;
  // Waits until the earliest job is due by steady_clock, the jobs change,
  // or the queue closes (ThreadScheduler's wait).
  void WaitForDue();
  // Cancels every job (waiting for a running one, unless called from it)
  // and refuses new ones.
  void Close();
  bool closed() const;

 private:
  struct Job {
    Clock::time_point due;
    Clock::duration every;  // zero: once
    std::function<void()> fn;
  };
  // Waits while id runs, unless this thread is running it.
  void WaitNotRunning(std::unique_lock<std::mutex>& lock, Scheduler::JobId id);

  const Clock* const clock_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<Scheduler::JobId, Job> jobs_;                             // protected by mu_
  std::set<std::pair<Clock::time_point, Scheduler::JobId>> by_due_;  // protected by mu_
  Scheduler::JobId next_id_ = 1;                                     // protected by mu_
  Scheduler::JobId running_ = 0;                                     // protected by mu_
  bool cancelled_running_ = false;                                   // protected by mu_
  bool closed_ = false;                                              // protected by mu_
};

// Jobs on one thread of its own (named `name`), by steady_clock.
class ThreadScheduler final : public Scheduler {
 public:
  explicit ThreadScheduler(std::string name);
  ~ThreadScheduler() override;
  ThreadScheduler(const ThreadScheduler&) = delete;
  ThreadScheduler& operator=(const ThreadScheduler&) = delete;

  const Clock* clock() const override { return SystemClock::Get(); }
  JobId RunAfter(Clock::duration delay, std::function<void()> fn) override;
  JobId RunEvery(Clock::duration every, std::function<void()> fn,
                 Clock::duration first = Clock::duration::zero()) override;
  void Cancel(JobId id) override;
  // Cancels every job and joins the thread. Idempotent.
  void Stop();

 private:
  void Loop();
  const std::string name_;
  JobQueue queue_;
  std::thread thread_;
};

}  // namespace kvpool
