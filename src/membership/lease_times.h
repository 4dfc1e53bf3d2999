// LeaseTimes: when an etcd member renews its lease and when it must decide
// whether it is cut off, from the renewals' outcomes alone (no clock of its
// own: every call is given the time). EtcdMembership's loop asks it what is
// due; tests step it on a ManualClock, so the fencing rules are checked
// exactly and without sleeping.
//
// The rules: a lease of TTL t is renewed every t/3; a failed renewal is
// retried after kKeepAliveRetry. When no renewal succeeded for t/2 (half
// the lease: the other half is the margin before etcd drops the member),
// the member judges (JudgeLease): it fences, or, when its peers vouch that
// etcd is down for them too, it keeps its view and asks again every
// kOutageRecheck while renewals keep failing.
//
// Not thread-safe: the membership loop's.
#pragma once

#include <algorithm>
#include <chrono>

#include "common/clock.h"

namespace kvpool {

class LeaseTimes {
 public:
  using time_point = Clock::time_point;
  static constexpr std::chrono::milliseconds kKeepAliveRetry{200};
  static constexpr std::chrono::milliseconds kOutageRecheck{250};

  // A lease of `ttl` was granted by a request sent at `sent`.
  void Granted(time_point sent, std::chrono::milliseconds ttl) {
    keepalive_interval_ = ttl / 3;
    fence_after_ = ttl / 2;
    Renewed(sent);
  }
  // A renewal sent at `sent` succeeded.
  void Renewed(time_point sent) {
    last_renewal_ = sent;
    next_outage_check_ = {};
    next_keepalive_ = sent + keepalive_interval_;
  }
  // A renewal sent at `sent` failed (etcd did not answer); it is `now`.
  void RenewFailed(time_point sent, time_point now) {
    if (first_failure_ <= last_renewal_) first_failure_ = sent;
    next_keepalive_ = now + kKeepAliveRetry;
  }
  // The peers vouched for the view at `now`: judge again later.
  void RodeOut(time_point now) { next_outage_check_ = now + kOutageRecheck; }

  bool KeepAliveDue(time_point now) const { return now >= next_keepalive_; }
  // When the member must judge whether it is cut off.
  time_point JudgeAt() const { return std::max(last_renewal_ + fence_after_, next_outage_check_); }
  bool JudgeDue(time_point now) const { return now >= JudgeAt(); }
  time_point next_keepalive() const { return next_keepalive_; }
  time_point last_renewal() const { return last_renewal_; }
  // Since when renewals fail: the peers that renewed after it prove etcd
  // answers others (JudgeLease's failing_since).
  time_point FailingSince() const { return std::max(first_failure_, last_renewal_); }

 private:
  std::chrono::milliseconds keepalive_interval_{0};
  std::chrono::milliseconds fence_after_{0};
  time_point last_renewal_{};       // when the last successful renewal was sent
  time_point first_failure_{};      // the first failed renewal after last_renewal_
  time_point next_outage_check_{};  // while renewals fail and peers vouch: the next judgement
  time_point next_keepalive_{};
};

}  // namespace kvpool
