#include "admin/metrics_history.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kvpool {
namespace {

TEST(MetricsHistoryTest, SamplesRatesRatiosAndQuantilesOfEachIntervalInABoundedRing) {
  MetricsRegistry m;
  Counter* get_ops = m.GetCounter("kvpool_ops_total", "", {{"op", "get"}});
  Counter* put_ops = m.GetCounter("kvpool_ops_total", "", {{"op", "put"}});
  Counter* hits = m.GetCounter("kvpool_hits_total", "");
  Counter* misses = m.GetCounter("kvpool_misses_total", "");
  Counter* read = m.GetCounter("kvpool_bytes_read_total", "");
  Counter* evictions = m.GetCounter("kvpool_dram_evictions_total", "");
  Gauge* dram = m.GetGauge("kvpool_dram_used_bytes", "");
  Histogram* get_lat = m.GetHistogram("kvpool_op_latency_seconds", "", {{"op", "get"}});
  Histogram* put_lat = m.GetHistogram("kvpool_op_latency_seconds", "", {{"op", "put"}});
  for (int i = 0; i < 1000; ++i) get_lat->Observe(1.0);  // before the first sample: not counted

  HistoryOptions o;
  o.interval = std::chrono::seconds(10);
  o.window = std::chrono::seconds(30);  // three samples kept
  ASSERT_TRUE(o.Validate().ok());
  MetricsHistory h(o, &m);
  h.Sample(1000);
  get_ops->Inc(30);
  put_ops->Inc(20);
  hits->Inc(30);
  misses->Inc(10);
  read->Inc(4096 * 30);
  evictions->Inc(5);
  dram->Set(1 << 20);
  for (int i = 0; i < 99; ++i) get_lat->Observe(0.001);  // (512 us, 1024 us]
  put_lat->Observe(0.001);
  h.Sample(1010);

  auto j = nlohmann::json::parse(h.Json());
  EXPECT_EQ(j["interval_s"], 10.0);
  EXPECT_EQ(j["window_s"], 30);
  ASSERT_EQ(j["t"], nlohmann::json::parse("[1000.0, 1010.0]"));
  const auto& s = j["series"];
  ASSERT_EQ(s.size(), MetricsHistory::SeriesNames().size());
  // The first sample has no interval behind it: rates are null.
  EXPECT_TRUE(s["ops_per_s"][0].is_null());
  EXPECT_TRUE(s["hit_ratio"][0].is_null());
  EXPECT_EQ(s["ops_per_s"][1], 5.0);  // 50 ops over 10 s, both ops
  EXPECT_EQ(s["read_bytes_per_s"][1], 4096.0 * 3);
  EXPECT_EQ(s["written_bytes_per_s"][1], 0.0);
  EXPECT_EQ(s["hit_ratio"][1], 0.75);
  // 100 latencies in (512, 1024] us this interval; the 1000 of 1 s before
  // the first sample do not count: the median is the bucket's middle.
  EXPECT_NEAR(s["latency_p50_s"][1].get<double>(), 768e-6, 1e-9);
  EXPECT_NEAR(s["latency_p99_s"][1].get<double>(), (512 + 512 * 0.99) * 1e-6, 1e-9);
  EXPECT_EQ(s["dram_used_bytes"][1], 1048576.0);
  EXPECT_TRUE(s["ssd_used_bytes"][1].is_null());  // no SSD tier
  EXPECT_EQ(s["evictions_per_s"][1], 0.5);
  EXPECT_EQ(s["peer_rx_bytes_per_s"][1], 0.0);  // no peers: nothing moved

  // An idle interval: rates 0, no ratio and no quantile to tell.
  h.Sample(1020);
  j = nlohmann::json::parse(h.Json());
  EXPECT_EQ(j["series"]["ops_per_s"][2], 0.0);
  EXPECT_TRUE(j["series"]["hit_ratio"][2].is_null());
  EXPECT_TRUE(j["series"]["latency_p50_s"][2].is_null());
  // The ring keeps the last three samples.
  h.Sample(1030);
  h.Sample(1040);
  j = nlohmann::json::parse(h.Json());
  EXPECT_EQ(j["t"], nlohmann::json::parse("[1020.0, 1030.0, 1040.0]"));
  EXPECT_EQ(j["series"]["ops_per_s"].size(), 3u);
}

TEST(MetricsHistoryTest, RefusesIntervalsAndWindowsOutOfBounds) {
  HistoryOptions o;
  o.interval = std::chrono::milliseconds(10);
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.interval = std::chrono::seconds(10);
  o.window = std::chrono::seconds(5);
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.interval = std::chrono::milliseconds(100);
  o.window = std::chrono::seconds(1000000);
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool
