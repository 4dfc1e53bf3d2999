#include "common/scheduler.h"

#include <pthread.h>

#include "common/check.h"

namespace kvpool {
namespace {
// The job this thread runs now (0: none): a job that cancels itself, or
// closes its queue, must not wait for itself.
thread_local Scheduler::JobId t_running = 0;
}  // namespace

Scheduler::JobId JobQueue::Add(Clock::duration delay, Clock::duration every,
                               std::function<void()> fn) {
  std::lock_guard lock(mu_);
  if (closed_) return 0;
  const Scheduler::JobId id = next_id_++;
  const Clock::time_point due = clock_->Now() + delay;
  jobs_.emplace(id, Job{due, every, std::move(fn)});
  by_due_.emplace(due, id);
  changed_.notify_all();
  return id;
}

void JobQueue::WaitNotRunning(std::unique_lock<std::mutex>& lock, Scheduler::JobId id) {
  if (t_running == id) return;
  changed_.wait(lock, [&] { return running_ != id; });
}

void JobQueue::Cancel(Scheduler::JobId id) {
  std::unique_lock lock(mu_);
  auto it = jobs_.find(id);
  if (it != jobs_.end()) {
    by_due_.erase({it->second.due, id});
    jobs_.erase(it);
    changed_.notify_all();
    return;
  }
  if (running_ != id || id == 0) return;
  cancelled_running_ = true;
  WaitNotRunning(lock, id);
}

bool JobQueue::RunOneDue() {
  std::unique_lock lock(mu_);
  if (by_due_.empty() || by_due_.begin()->first > clock_->Now()) return false;
  const Scheduler::JobId id = by_due_.begin()->second;
  by_due_.erase(by_due_.begin());
  auto it = jobs_.find(id);
  Job job = std::move(it->second);
  jobs_.erase(it);
  running_ = id;
  cancelled_running_ = false;
  lock.unlock();
  t_running = id;
  job.fn();
  t_running = 0;
  lock.lock();
  running_ = 0;
  if (job.every > Clock::duration::zero() && !cancelled_running_ && !closed_) {
    job.due = clock_->Now() + job.every;
    by_due_.emplace(job.due, id);
    jobs_.emplace(id, std::move(job));
  }
  changed_.notify_all();
  return true;
}

bool JobQueue::NextDue(Clock::time_point* due) const {
  std::lock_guard lock(mu_);
  if (by_due_.empty()) return false;
  *due = by_due_.begin()->first;
  return true;
}

void JobQueue::WaitForDue() {
  std::unique_lock lock(mu_);
  if (closed_) return;
  if (by_due_.empty()) {
    changed_.wait(lock);
    return;
  }
  if (by_due_.begin()->first <= clock_->Now()) return;
  changed_.wait_until(lock, by_due_.begin()->first);
}

void JobQueue::Close() {
  std::unique_lock lock(mu_);
  closed_ = true;
  jobs_.clear();
  by_due_.clear();
  changed_.notify_all();
  if (running_ != 0) {
    cancelled_running_ = true;
    WaitNotRunning(lock, running_);
  }
}

bool JobQueue::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

ThreadScheduler::ThreadScheduler(std::string name)
    : name_(std::move(name)), queue_(SystemClock::Get()) {
  thread_ = std::thread([this] { Loop(); });
}

ThreadScheduler::~ThreadScheduler() { Stop(); }

Scheduler::JobId ThreadScheduler::RunAfter(Clock::duration delay, std::function<void()> fn) {
  return queue_.Add(delay, Clock::duration::zero(), std::move(fn));
}

Scheduler::JobId ThreadScheduler::RunEvery(Clock::duration every, std::function<void()> fn,
                                           Clock::duration first) {
  KVPOOL_CHECK(every > Clock::duration::zero());
  return queue_.Add(first, every, std::move(fn));
}

void ThreadScheduler::Cancel(JobId id) { queue_.Cancel(id); }

void ThreadScheduler::Stop() {
  queue_.Close();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // a job stopped its own scheduler: the loop ends after it
  } else {
    thread_.join();
  }
}

void ThreadScheduler::Loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  while (!queue_.closed()) {
    if (!queue_.RunOneDue()) queue_.WaitForDue();
  }
}

}  // namespace kvpool
