#include "common/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "testing/manual_scheduler.h"
#include "testing/wait_for.h"

namespace kvpool {
namespace {

using std::chrono::milliseconds;

// The manual twin runs jobs in due order at their times, re-arms a
// periodic job `every` after its run, and runs nothing it was not told to.
TEST(SchedulerTest, ManualJobsRunInDueOrderAtTheirTimes) {
  testing::ManualScheduler s;
  const auto t0 = s.clock()->Now();
  std::vector<std::pair<char, milliseconds>> ran;
  auto at = [&] { return std::chrono::duration_cast<milliseconds>(s.clock()->Now() - t0); };
  s.RunAfter(milliseconds(30), [&] { ran.push_back({'a', at()}); });
  s.RunEvery(
      milliseconds(20),
      [&] {
        ran.push_back({'e', at()});
      },
      milliseconds(10));
  s.RunAfter(milliseconds(5), [&] { ran.push_back({'b', at()}); });
  EXPECT_TRUE(ran.empty());
  EXPECT_EQ(s.Advance(milliseconds(50)), 5u);
  const std::vector<std::pair<char, milliseconds>> want = {{'b', milliseconds(5)},
                                                           {'e', milliseconds(10)},
                                                           {'a', milliseconds(30)},
                                                           {'e', milliseconds(30)},
                                                           {'e', milliseconds(50)}};
  EXPECT_EQ(ran, want);
  EXPECT_EQ(at(), milliseconds(50));
  ASSERT_TRUE(s.RunNext());  // the periodic job, 20 ms on
  EXPECT_EQ(ran.back(), std::make_pair('e', milliseconds(70)));
}

// A cancelled job never runs again, also when it cancels itself.
TEST(SchedulerTest, CancelledJobsDoNotRunAgain) {
  testing::ManualScheduler s;
  int a = 0, b = 0;
  auto ja = s.RunEvery(milliseconds(10), [&] { ++a; });
  Scheduler::JobId jb = 0;
  jb = s.RunEvery(milliseconds(10), [&] {
    if (++b == 2) s.Cancel(jb);
  });
  s.Advance(milliseconds(25));
  EXPECT_EQ(a, 3);  // at 0, 10, 20
  EXPECT_EQ(b, 2);  // at 0, 10: cancelled by itself
  s.Cancel(ja);
  EXPECT_EQ(s.Advance(milliseconds(100)), 0u);
  EXPECT_FALSE(s.RunNext());
  EXPECT_EQ(a, 3);
}

// The thread scheduler runs a periodic job on its thread until cancelled;
// when Cancel returns the job is not running, and it never runs again.
TEST(SchedulerTest, ThreadSchedulerRunsUntilCancelled) {
  ThreadScheduler s("test-sched");
  std::atomic<int> runs{0};
  auto job = s.RunEvery(milliseconds(1), [&] { ++runs; });
  ASSERT_TRUE(testing::WaitFor([&] { return runs.load() >= 3; }));
  s.Cancel(job);
  const int after = runs.load();
  std::atomic<bool> once{false};
  s.RunAfter(milliseconds(1), [&] { once = true; });
  ASSERT_TRUE(testing::WaitFor([&] { return once.load(); }));  // later jobs still run
  s.Stop();
  EXPECT_EQ(runs.load(), after);
}

}  // namespace
}  // namespace kvpool
