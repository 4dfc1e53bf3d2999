#include "admin/metrics_history.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace kvpool {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A counter family's total, 0 when the node has none (e.g. no peers).
double Total(const MetricsRegistry* m, const char* name) {
  const double v = m->SumOf(name);
  return v < 0 ? 0 : v;
}

}  // namespace

Status HistoryOptions::Validate() const {
  if (interval < std::chrono::milliseconds(100) || interval > std::chrono::minutes(10)) {
    return InvalidArgument("history: the interval must be in [100ms, 10min]");
  }
  if (window < interval || capacity() > 100000) {
    return InvalidArgument("history: the window must hold 1 to 100000 intervals");
  }
  return Status::Ok();
}

size_t HistoryOptions::capacity() const {
  return static_cast<size_t>(std::chrono::duration_cast<std::chrono::milliseconds>(window) /
                             interval);
}

const std::vector<std::string>& MetricsHistory::SeriesNames() {
  static const std::vector<std::string> names = {
      "ops_per_s",       "read_bytes_per_s",    "written_bytes_per_s", "hit_ratio",
      "latency_p50_s",   "latency_p99_s",       "dram_used_bytes",     "ssd_used_bytes",
      "evictions_per_s", "peer_rx_bytes_per_s", "peer_tx_bytes_per_s"};
  return names;
}

MetricsHistory::MetricsHistory(const HistoryOptions& options, const MetricsRegistry* metrics)
    : options_(options), metrics_(metrics) {}

MetricsHistory::~MetricsHistory() { Stop(); }

void MetricsHistory::Start() {
  if (job_ != 0) return;
  scheduler_ = options_.scheduler;
  if (scheduler_ == nullptr) {
    own_scheduler_ = std::make_unique<ThreadScheduler>("kvpool-history");
    scheduler_ = own_scheduler_.get();
  }
  const Clock* clock = scheduler_->clock();
  const Clock::time_point start = clock->Now();
  const double start_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  job_ = scheduler_->RunEvery(options_.interval, [this, clock, start, start_unix] {
    Sample(start_unix + std::chrono::duration<double>(clock->Now() - start).count());
  });
}

void MetricsHistory::Stop() {
  if (job_ != 0) scheduler_->Cancel(job_);  // waits for a running sample
  job_ = 0;
  own_scheduler_.reset();
}

MetricsHistory::Reading MetricsHistory::Read(double unix_seconds) const {
  Reading r;
  r.t = unix_seconds;
  r.ops = Total(metrics_, "kvpool_ops_total");
  r.read_bytes = Total(metrics_, "kvpool_bytes_read_total");
  r.written_bytes = Total(metrics_, "kvpool_bytes_written_total");
  r.hits = Total(metrics_, "kvpool_hits_total");
  r.misses = Total(metrics_, "kvpool_misses_total");
  r.evictions = Total(metrics_, "kvpool_dram_evictions_total");
  r.peer_rx = Total(metrics_, "kvpool_transport_bytes_received_total");
  r.peer_tx = Total(metrics_, "kvpool_transport_bytes_sent_total");
  if (!metrics_->HistogramSumOf("kvpool_op_latency_seconds", &r.latency_bounds, &r.latency)) {
    r.latency.clear();
  }
  r.dram_used = metrics_->SumOf("kvpool_dram_used_bytes");
  r.ssd_used = metrics_->SumOf("kvpool_ssd_used_bytes");
  return r;
}

void MetricsHistory::Sample(double unix_seconds) {
  Reading now = Read(unix_seconds);
  std::lock_guard lock(mu_);
  std::vector<double> row(1 + SeriesNames().size(), kNaN);
  row[0] = unix_seconds;
  const Reading& p = previous_;
  const double dt = now.t - p.t;
  if (have_previous_ && dt > 0) {
    auto rate = [dt](double a, double b) { return a >= b ? (a - b) / dt : kNaN; };
    row[1] = rate(now.ops, p.ops);
    row[2] = rate(now.read_bytes, p.read_bytes);
    row[3] = rate(now.written_bytes, p.written_bytes);
    const double hits = now.hits - p.hits, misses = now.misses - p.misses;
    if (hits + misses > 0) row[4] = hits / (hits + misses);
    if (!now.latency.empty() && now.latency.size() == p.latency.size() &&
        now.latency.back() > p.latency.back()) {
      std::vector<uint64_t> delta(now.latency.size());
      for (size_t i = 0; i < delta.size(); ++i) delta[i] = now.latency[i] - p.latency[i];
      row[5] = Histogram::QuantileOf(now.latency_bounds, delta, 0.5);
      row[6] = Histogram::QuantileOf(now.latency_bounds, delta, 0.99);
    }
    row[9] = rate(now.evictions, p.evictions);
    row[10] = rate(now.peer_rx, p.peer_rx);
    row[11] = rate(now.peer_tx, p.peer_tx);
  }
  row[7] = now.dram_used < 0 ? kNaN : now.dram_used;
  row[8] = now.ssd_used < 0 ? kNaN : now.ssd_used;  // no SSD tier: none
  previous_ = std::move(now);
  have_previous_ = true;
  ring_.push_back(std::move(row));
  while (ring_.size() > options_.capacity()) ring_.pop_front();
}

std::string MetricsHistory::Json() const {
  auto value = [](double v) {
    return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
  };
  nlohmann::ordered_json t = nlohmann::ordered_json::array();
  nlohmann::ordered_json series = nlohmann::ordered_json::object();
  const auto& names = SeriesNames();
  std::lock_guard lock(mu_);
  for (const auto& row : ring_) t.push_back(row[0]);
  for (size_t k = 0; k < names.size(); ++k) {
    nlohmann::ordered_json s = nlohmann::ordered_json::array();
    for (const auto& row : ring_) s.push_back(value(row[k + 1]));
    series[names[k]] = std::move(s);
  }
  nlohmann::ordered_json j = {
      {"interval_s", std::chrono::duration<double>(options_.interval).count()},
      {"window_s", options_.window.count()},
      {"t", std::move(t)},
      {"series", std::move(series)}};
  return j.dump();
}

}  // namespace kvpool
