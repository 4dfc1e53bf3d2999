// RecentRatio: a numerator and a denominator summed over the last seconds
// (hits over lookups, ages over evictions), for gauges that show what a node
// does now rather than since it started.
//
// Sums are kept in one-second buckets, so no thread has to sample them: Add
// stamps the bucket of the current second, and Sums adds the buckets of the
// window. Thread-safe; Add takes a mutex held for a few instructions.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "common/clock.h"

namespace kvpool {

// The windows a node's recent gauges are exported for: their "window" label
// and length in seconds.
struct RecentWindow {
  const char* label;
  int seconds;
};
inline constexpr RecentWindow kRecentWindows[] = {{"1m", 60}, {"10m", 600}};

class RecentRatio {
 public:
  static constexpr int kMaxWindowSeconds = 600;

  explicit RecentRatio(const Clock* clock = SystemClock::Get()) : clock_(clock) {}

  void Add(uint64_t num, uint64_t den);

  struct Sums {
    uint64_t num = 0;
    uint64_t den = 0;
  };
  // Over the last window_seconds (1..kMaxWindowSeconds), the current second
  // included.
  Sums Over(int window_seconds) const;
  // num / den over the window; NaN when den is 0 there (nothing happened).
  double Ratio(int window_seconds) const {
    Sums s = Over(window_seconds);
    return s.den == 0 ? std::nan("") : static_cast<double>(s.num) / static_cast<double>(s.den);
  }

 private:
  struct Bucket {
    int64_t second = -1;
    uint64_t num = 0;
    uint64_t den = 0;
  };
  int64_t NowSecond() const;

  const Clock* const clock_;
  mutable std::mutex mu_;
  std::array<Bucket, kMaxWindowSeconds> buckets_;  // protected by mu_
};

}  // namespace kvpool
