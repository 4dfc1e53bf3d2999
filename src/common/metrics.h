// MetricsRegistry: counters, gauges and histograms, rendered in the
// Prometheus text format (version 0.0.4).
//
// Components register the metrics they own and keep the returned pointers;
// the registry owns the metric objects and outlives them. Updating a metric is
// a relaxed atomic operation. Registration and rendering are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kvpool {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void Add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  int64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// Fixed upper bounds (ascending); values above the last land in +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then the total count as the last element.
  std::vector<uint64_t> CumulativeCounts() const;
  double Sum() const;
  uint64_t Count() const;
  // Linear interpolation inside the bucket holding quantile q (0..1); 0 when empty.
  double Quantile(double q) const;
  // The same over given bounds and cumulative counts (as CumulativeCounts:
  // one per bound, then the total), e.g. the difference of two readings.
  static double QuantileOf(const std::vector<double>& bounds, const std::vector<uint64_t>& cum,
                           double q);

  // Exponential bounds: start, start*factor, ... (count bounds).
  static std::vector<double> ExponentialBounds(double start, double factor, int count);
  // 1 µs .. ~16 s in seconds, doubling: the default for latencies.
  static std::vector<double> LatencySecondsBounds();

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<uint64_t> sum_bits_{0};                // a double, updated by CAS
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the series (name, labels), creating it on first use. The same
  // name must keep one type. REQUIRES: name matches [a-zA-Z_:][a-zA-Z0-9_:]*.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const Labels& labels = {},
                          std::vector<double> bounds = Histogram::LatencySecondsBounds());
  // A gauge computed when rendered. The callback must be thread-safe and
  // stay valid until RemoveCallbacks(owner) or the registry's destruction.
  void AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> fn, const void* owner = nullptr);
  void RemoveCallbacks(const void* owner);

  std::string RenderPrometheus() const;
  // Value of a counter or gauge series, or -1 when it does not exist (tests, stats).
  double ValueOf(const std::string& name, const Labels& labels = {}) const;
  // The sum of a counter or gauge family over all its label sets, or -1
  // when it does not exist.
  double SumOf(const std::string& name) const;
  // A histogram family's cumulative counts (as Histogram::CumulativeCounts)
  // summed over its label sets, and its bounds. False when it does not
  // exist or its series have different bounds.
  bool HistogramSumOf(const std::string& name, std::vector<double>* bounds,
                      std::vector<uint64_t>* cumulative) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
