// The lease and fencing timing of an etcd member (LeaseTimes), stepped on a
// manual clock: when it renews, retries, judges, and judges again while its
// peers vouch that etcd is down for everyone.
#include "membership/lease_times.h"

#include <gtest/gtest.h>

#include <chrono>

#include "common/clock.h"

namespace kvpool {
namespace {

using std::chrono::milliseconds;

TEST(LeaseTimesTest, RenewsEveryThirdOfTheTtlAndJudgesAtHalfWithoutARenewal) {
  ManualClock clock;
  const auto t0 = clock.Now();
  LeaseTimes l;
  l.Granted(t0, milliseconds(3000));
  EXPECT_FALSE(l.KeepAliveDue(t0 + milliseconds(999)));
  EXPECT_TRUE(l.KeepAliveDue(t0 + milliseconds(1000)));
  EXPECT_EQ(l.JudgeAt(), t0 + milliseconds(1500));
  // Renewed at 1 s: the next at 2 s, the judgement moves to 2.5 s.
  l.Renewed(t0 + milliseconds(1000));
  EXPECT_EQ(l.next_keepalive(), t0 + milliseconds(2000));
  EXPECT_FALSE(l.JudgeDue(t0 + milliseconds(2499)));
  EXPECT_TRUE(l.JudgeDue(t0 + milliseconds(2500)));
  EXPECT_EQ(l.last_renewal(), t0 + milliseconds(1000));
}

TEST(LeaseTimesTest, FailedRenewalsAreRetriedAndTheFailingStartIsTheFirstFailure) {
  ManualClock clock;
  const auto t0 = clock.Now();
  LeaseTimes l;
  l.Granted(t0, milliseconds(3000));
  // Renewals fail from 1 s on: retried every 200 ms after each failure.
  l.RenewFailed(t0 + milliseconds(1000), t0 + milliseconds(1100));
  EXPECT_EQ(l.next_keepalive(), t0 + milliseconds(1300));
  l.RenewFailed(t0 + milliseconds(1300), t0 + milliseconds(1350));
  EXPECT_EQ(l.next_keepalive(), t0 + milliseconds(1550));
  EXPECT_EQ(l.FailingSince(), t0 + milliseconds(1000));  // the first failure, not the last
  // No renewal since t0: the judgement is due at half the TTL, 1.5 s.
  EXPECT_FALSE(l.JudgeDue(t0 + milliseconds(1499)));
  EXPECT_TRUE(l.JudgeDue(t0 + milliseconds(1500)));
  // A renewal ends the failing: the next failure starts a new count.
  l.Renewed(t0 + milliseconds(1550));
  EXPECT_EQ(l.FailingSince(), t0 + milliseconds(1550));
  l.RenewFailed(t0 + milliseconds(2600), t0 + milliseconds(2650));
  EXPECT_EQ(l.FailingSince(), t0 + milliseconds(2600));
  EXPECT_EQ(l.JudgeAt(), t0 + milliseconds(3050));
}

TEST(LeaseTimesTest, WhileThePeersVouchItJudgesAgainEveryRecheckUntilARenewal) {
  ManualClock clock;
  const auto t0 = clock.Now();
  LeaseTimes l;
  l.Granted(t0, milliseconds(3000));
  l.RenewFailed(t0 + milliseconds(1000), t0 + milliseconds(1000));
  ASSERT_TRUE(l.JudgeDue(t0 + milliseconds(1500)));
  l.RodeOut(t0 + milliseconds(1500));  // the peers: etcd is down for us too
  EXPECT_EQ(l.JudgeAt(), t0 + milliseconds(1500) + LeaseTimes::kOutageRecheck);
  EXPECT_FALSE(l.JudgeDue(t0 + milliseconds(1749)));
  EXPECT_TRUE(l.JudgeDue(t0 + milliseconds(1750)));
  l.RodeOut(t0 + milliseconds(1750));
  EXPECT_EQ(l.JudgeAt(), t0 + milliseconds(2000));
  // etcd is back: the recheck is dropped and the usual rule holds again.
  l.Renewed(t0 + milliseconds(1900));
  EXPECT_EQ(l.JudgeAt(), t0 + milliseconds(3400));
}

}  // namespace
}  // namespace kvpool
