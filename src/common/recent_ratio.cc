#include "common/recent_ratio.h"

#include <algorithm>

namespace kvpool {

int64_t RecentRatio::NowSecond() const {
  return std::chrono::duration_cast<std::chrono::seconds>(clock_->Now().time_since_epoch())
      .count();
}

void RecentRatio::Add(uint64_t num, uint64_t den) {
  const int64_t now = NowSecond();
  std::lock_guard lock(mu_);
  Bucket& b = buckets_[static_cast<size_t>(now % kMaxWindowSeconds)];
  if (b.second != now) b = Bucket{now, 0, 0};
  b.num += num;
  b.den += den;
}

RecentRatio::Sums RecentRatio::Over(int window_seconds) const {
  const int64_t now = NowSecond();
  const int64_t oldest = now - std::clamp(window_seconds, 1, kMaxWindowSeconds) + 1;
  Sums s;
  std::lock_guard lock(mu_);
  for (const Bucket& b : buckets_) {
    if (b.second < oldest || b.second > now) continue;
    s.num += b.num;
    s.den += b.den;
  }
  return s;
}

}  // namespace kvpool
