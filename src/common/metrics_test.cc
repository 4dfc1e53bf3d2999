#include "common/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvpool {
namespace {

TEST(MetricsTest, RendersCountersGaugesWithLabels) {
  MetricsRegistry r;
  r.GetCounter("kvpool_ops_total", "Ops", {{"op", "get"}})->Inc(3);
  r.GetCounter("kvpool_ops_total", "Ops", {{"op", "put"}})->Inc();
  r.GetGauge("kvpool_things", "Things")->Set(-7);
  r.AddCallbackGauge("kvpool_ratio", "Ratio", {{"k", "a\"b"}}, [] { return 0.5; });
  std::string text = r.RenderPrometheus();
  EXPECT_NE(text.find("# TYPE kvpool_ops_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("kvpool_ops_total{op=\"get\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("kvpool_ops_total{op=\"put\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvpool_things -7\n"), std::string::npos);
  EXPECT_NE(text.find("kvpool_ratio{k=\"a\\\"b\"} 0.5\n"), std::string::npos);
  EXPECT_EQ(r.ValueOf("kvpool_ops_total", {{"op", "get"}}), 3);
  EXPECT_EQ(r.ValueOf("kvpool_missing"), -1);
}

TEST(MetricsTest, SameSeriesReturnsSameObject) {
  MetricsRegistry r;
  Counter* a = r.GetCounter("x_total", "x", {{"a", "1"}});
  Counter* b = r.GetCounter("x_total", "x", {{"a", "1"}});
  EXPECT_EQ(a, b);
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  MetricsRegistry r;
  Histogram* h = r.GetHistogram("lat_seconds", "Latency", {}, {0.001, 0.01, 0.1});
  h->Observe(0.0005);
  h->Observe(0.005);
  h->Observe(0.005);
  h->Observe(5);
  std::string text = r.RenderPrometheus();
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.01\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.1\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("lat_seconds_count 4\n"), std::string::npos);
  EXPECT_NEAR(h->Sum(), 5.0105, 1e-9);
  EXPECT_EQ(h->Count(), 4u);
  EXPECT_GT(h->Quantile(0.5), 0.001);
  EXPECT_LE(h->Quantile(0.5), 0.01);
}

TEST(MetricsTest, CallbacksRemovedByOwner) {
  MetricsRegistry r;
  int owner;
  r.AddCallbackGauge("cb", "cb", {}, [] { return 1.0; }, &owner);
  EXPECT_EQ(r.ValueOf("cb"), 1);
  r.RemoveCallbacks(&owner);
  EXPECT_EQ(r.ValueOf("cb"), -1);
}

TEST(MetricsTest, ConcurrentIncrementsAreExact) {
  MetricsRegistry r;
  Counter* c = r.GetCounter("c_total", "c");
  Histogram* h = r.GetHistogram("h_seconds", "h");
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        c->Inc();
        h->Observe(1e-5);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(c->Value(), 400000u);
  EXPECT_EQ(h->Count(), 400000u);
  EXPECT_NEAR(h->Sum(), 4.0, 1e-6);
}

}  // namespace
}  // namespace kvpool
