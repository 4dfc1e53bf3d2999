// Executor: where components run background work. Components never start
// threads of their own; the node gives them one (ThreadPool), and so do the
// tests (a small ThreadPool; there is no inline or manual executor, as the
// components hand work on from transport threads and expect it to run
// later, on another thread). Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvpool {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs fn at some point on some thread. Never blocks on the work itself.
  virtual void Submit(std::function<void()> fn) = 0;
};

// A fixed pool of worker threads. Destruction (or Stop) runs what was
// already submitted, then joins the threads; later submissions are dropped.
class ThreadPool final : public Executor {
 public:
  ThreadPool(int threads, std::string name);
  ~ThreadPool() override;
  void Submit(std::function<void()> fn) override;
  void Stop();
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // protected by mu_
  bool stopping_ = false;                    // protected by mu_
  std::vector<std::thread> threads_;
  std::string name_;
};

}  // namespace kvpool
