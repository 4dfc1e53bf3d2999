// MetricsHistory: the node's key figures over a recent window, for the
// dashboard's charts (/api/v1/history). Every interval a scheduler job reads
// the metrics registry and appends one sample to a ring of window/interval
// samples (15 minutes at 5 s: 180), so memory is fixed: 180 x 12 doubles.
// A sample's rates are the change since the previous sample over the time
// between them; quantiles come from the change of the latency histogram, so
// each sample describes its own interval, not the time since start.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/scheduler.h"
#include "common/status.h"

namespace kvpool {

struct HistoryOptions {
  // Between samples: shorter draws finer charts, longer keeps more time in
  // the same memory.
  std::chrono::milliseconds interval{5000};
  // Kept: the charts' time span.
  std::chrono::seconds window{900};
  // Where the sampling runs (not owned; outlives the history); null: a
  // scheduler thread of the history's own.
  Scheduler* scheduler = nullptr;

  Status Validate() const;
  size_t capacity() const;  // samples kept
};

class MetricsHistory {
 public:
  // The series of a sample, in the order of the JSON's "series" object.
  // Rates are per second over the sample's interval; ratios and quantiles
  // null (NaN) when the interval had nothing to measure.
  static const std::vector<std::string>& SeriesNames();

  // REQUIRES: options valid; metrics outlives this.
  MetricsHistory(const HistoryOptions& options, const MetricsRegistry* metrics);
  ~MetricsHistory();
  MetricsHistory(const MetricsHistory&) = delete;
  MetricsHistory& operator=(const MetricsHistory&) = delete;

  // Samples every interval, the first at once, until Stop (idempotent). A
  // sample is stamped with the wall clock at Start plus the scheduler's
  // time since.
  void Start();
  void Stop();
  // Takes one sample stamped unix_seconds (the job's step; tests call it).
  void Sample(double unix_seconds);
  // {"interval_s": 5, "window_s": 900, "t": [unix seconds, ...],
  //  "series": {"ops_per_s": [...], ...}} oldest first; NaN as null.
  std::string Json() const;

 private:
  // Counter readings of one moment, for the next sample's rates.
  struct Reading {
    double t = 0;
    double ops = 0, read_bytes = 0, written_bytes = 0, hits = 0, misses = 0;
    double evictions = 0, peer_rx = 0, peer_tx = 0;
    double dram_used = -1, ssd_used = -1;  // -1: no such gauge
    std::vector<double> latency_bounds;
    std::vector<uint64_t> latency;  // cumulative counts
  };
  Reading Read(double unix_seconds) const;

  const HistoryOptions options_;
  const MetricsRegistry* const metrics_;

  std::unique_ptr<ThreadScheduler> own_scheduler_;  // when options_.scheduler is null
  Scheduler* scheduler_ = nullptr;
  Scheduler::JobId job_ = 0;

  mutable std::mutex mu_;
  bool have_previous_ = false;            // mu_
  Reading previous_;                      // mu_
  std::deque<std::vector<double>> ring_;  // mu_: per sample, t then the series
};

}  // namespace kvpool
