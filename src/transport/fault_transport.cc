#include "transport/fault_transport.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

namespace kvpool::transport {

struct FaultTransport::State {
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<std::string, FaultRule> rules;                           // protected by mu
  FaultRule default_rule;                                                     // protected by mu
  std::mt19937_64 rng;                                                        // protected by mu
  std::multimap<std::pair<Deadline, uint64_t>, std::function<void()>> timers;  // protected by mu
  uint64_t seq = 0;                                                           // protected by mu
  bool stopping = false;                                                      // protected by mu
  std::thread thread;

  void Loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      if (timers.empty()) {
        if (stopping) return;
        cv.wait(lock);
        continue;
      }
      auto it = timers.begin();
      // On shutdown the remaining timers fire at once, so no call is lost.
      if (!stopping && it->first.first > SteadyClock::now()) {
        cv.wait_until(lock, it->first.first);
        continue;
      }
      auto fn = std::move(it->second);
      timers.erase(it);
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  // REQUIRES: mu held.
  void AddTimerLocked(Deadline when, std::function<void()> fn) {
    timers.emplace(std::make_pair(when, seq++), std::move(fn));
    cv.notify_one();
  }
};

FaultTransport::FaultTransport(Transport* inner, uint64_t seed)
    : state_(std::make_shared<State>()), inner_(inner) {
  state_->rng.seed(seed);
  state_->thread = std::thread([s = state_.get()] { s->Loop(); });
}

FaultTransport::~FaultTransport() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    state_->cv.notify_one();
  }
  state_->thread.join();
}

void FaultTransport::SetRule(const std::string& peer, const FaultRule& rule) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->rules[peer] = rule;
}

void FaultTransport::SetDefaultRule(const FaultRule& rule) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->default_rule = rule;
}

void FaultTransport::ClearRules() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->rules.clear();
  state_->default_rule = FaultRule{};
}

std::string FaultTransport::address() const { return inner_->address(); }

void FaultTransport::RegisterHandler(MessageType type, Handler handler) {
  inner_->RegisterHandler(type, std::move(handler));
}

void FaultTransport::Call(const CallArgs& args, ReplyCallback done) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->rules.find(args.peer);
  const FaultRule& rule = it != state_->rules.end() ? it->second : state_->default_rule;
  if (rule.unavailable) {
    state_->AddTimerLocked(SteadyClock::now(), [done = std::move(done)] {
      done(Reply{Unavailable("fault: peer reset"), {}, 0, {}});
    });
    return;
  }
  if (rule.drop_probability > 0 &&
      std::uniform_real_distribution<double>(0, 1)(state_->rng) < rule.drop_probability) {
    state_->AddTimerLocked(args.deadline, [done = std::move(done)] {
      done(Reply{DeadlineExceeded("call timed out (fault: dropped)"), {}, 0, {}});
    });
    return;
  }
  auto delay = rule.delay;
  if (rule.jitter.count() > 0) {
    delay += std::chrono::microseconds(std::uniform_int_distribution<int64_t>(
        0, rule.jitter.count())(state_->rng));
  }
  // The request bytes must be copied: Call() promises the caller they are
  // free once it returns. Payload and sink stay the caller's (valid until done).
  auto request = std::make_shared<std::vector<uint8_t>>(args.request.begin(), args.request.end());
  CallArgs copy = args;
  Transport* inner = inner_;
  auto send = [inner, copy, request, done = std::move(done)]() mutable {
    copy.request = *request;
    if (SteadyClock::now() >= copy.deadline) {
      done(Reply{DeadlineExceeded("call timed out (fault: delayed)"), {}, 0, {}});
      return;
    }
    inner->Call(copy, [request, done = std::move(done)](Reply r) mutable { done(std::move(r)); });
  };
  // Even without a delay the call goes through the timer thread, so `done`
  // never runs inside Call().
  state_->AddTimerLocked(std::min(SteadyClock::now() + delay, args.deadline), std::move(send));
}

}  // namespace kvpool::transport
