#include "common/recent_ratio.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvpool {
namespace {

using std::chrono::seconds;

TEST(RecentRatioTest, SumsOnlyTheWindowAndForgetsOlderSeconds) {
  ManualClock clock;
  RecentRatio r(&clock);
  EXPECT_TRUE(std::isnan(r.Ratio(60)));  // nothing happened yet
  r.Add(1, 4);                           // t = 0
  clock.Advance(seconds(30));
  r.Add(3, 4);  // t = 30
  EXPECT_EQ(r.Over(60).num, 4u);
  EXPECT_EQ(r.Over(60).den, 8u);
  EXPECT_DOUBLE_EQ(r.Ratio(60), 0.5);
  EXPECT_DOUBLE_EQ(r.Ratio(10), 0.75);  // t = 0 is outside the last 10 s
  clock.Advance(seconds(31));           // t = 61: t = 0 left the minute
  EXPECT_DOUBLE_EQ(r.Ratio(60), 0.75);
  EXPECT_DOUBLE_EQ(r.Ratio(600), 0.5);
  clock.Advance(seconds(600));  // everything is older than the longest window
  EXPECT_TRUE(std::isnan(r.Ratio(600)));
  EXPECT_EQ(r.Over(600).den, 0u);
}

TEST(RecentRatioTest, ABucketReusedAfterAWrapStartsFromZero) {
  ManualClock clock;
  RecentRatio r(&clock);
  r.Add(5, 5);
  clock.Advance(seconds(RecentRatio::kMaxWindowSeconds));  // the same bucket, 600 s later
  r.Add(0, 2);
  EXPECT_EQ(r.Over(600).num, 0u);
  EXPECT_EQ(r.Over(600).den, 2u);
  EXPECT_DOUBLE_EQ(r.Ratio(1), 0.0);
}

TEST(RecentRatioTest, WindowsOutsideTheRangeAreClamped) {
  ManualClock clock;
  RecentRatio r(&clock);
  r.Add(2, 3);
  EXPECT_EQ(r.Over(0).den, 3u);      // at least the current second
  EXPECT_EQ(r.Over(100000).den, 3u);  // at most kMaxWindowSeconds
}

}  // namespace
}  // namespace kvpool
