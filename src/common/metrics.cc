#include "common/metrics.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <map>

#include "common/check.h"

namespace kvpool {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  size_t lo = 0, hi = bounds_.size();
  while (lo < hi) {  // first bound >= v
    size_t mid = (lo + hi) / 2;
    if (bounds_[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  counts_[lo].fetch_add(1, std::memory_order_relaxed);
  uint64_t old_bits = sum_bits_.load(std::memory_order_relaxed);
  while (!sum_bits_.compare_exchange_weak(
      old_bits, std::bit_cast<uint64_t>(std::bit_cast<double>(old_bits) + v),
      std::memory_order_relaxed)) {
  }
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += counts_[i].load(std::memory_order_relaxed);
    out[i] = acc;
  }
  return out;
}

double Histogram::Sum() const { return std::bit_cast<double>(sum_bits_.load()); }

uint64_t Histogram::Count() const { return CumulativeCounts().back(); }

double Histogram::Quantile(double q) const { return QuantileOf(bounds_, CumulativeCounts(), q); }

double Histogram::QuantileOf(const std::vector<double>& bounds, const std::vector<uint64_t>& cum,
                             double q) {
  if (cum.empty() || cum.back() == 0) return 0;
  double rank = q * static_cast<double>(cum.back());
  for (size_t i = 0; i < cum.size(); ++i) {
    if (static_cast<double>(cum[i]) >= rank) {
      if (i >= bounds.size()) return bounds.empty() ? 0 : bounds.back();
      double lower = i == 0 ? 0 : bounds[i - 1];
      uint64_t below = i == 0 ? 0 : cum[i - 1];
      uint64_t in = cum[i] - below;
      double frac = in == 0 ? 1 : (rank - static_cast<double>(below)) / static_cast<double>(in);
      return lower + (bounds[i] - lower) * frac;
    }
  }
  return bounds.empty() ? 0 : bounds.back();
}

std::vector<double> Histogram::ExponentialBounds(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> Histogram::LatencySecondsBounds() { return ExponentialBounds(1e-6, 2, 25); }

namespace {

enum class Kind { kCounter, kGauge, kHistogram };

struct Series {
  Labels labels;
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::function<double()> fn;
  const void* owner = nullptr;
};

struct Family {
  Kind kind;
  std::string help;
  std::vector<std::unique_ptr<Series>> series;
};

std::string EscapeLabel(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

std::string EscapeHelp(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

std::string LabelText(const Labels& labels, const std::string& extra_key = "",
                      const std::string& extra_value = "") {
  if (labels.empty() && extra_key.empty()) return "";
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) s += ",";
    first = false;
    s += k + "=\"" + EscapeLabel(v) + "\"";
  }
  if (!extra_key.empty()) {
    if (!first) s += ",";
    s += extra_key + "=\"" + extra_value + "\"";
  }
  return s + "}";
}

std::string FormatNumber(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

}  // namespace

struct MetricsRegistry::Impl {
  mutable std::mutex mu;
  std::map<std::string, Family> families;  // protected by mu

  Series* Find(const std::string& name, Kind kind, const std::string& help,
               const Labels& labels) {
    auto [it, inserted] = families.try_emplace(name);
    Family& f = it->second;
    if (inserted) {
      f.kind = kind;
      f.help = help;
    }
    KVPOOL_CHECK(f.kind == kind);
    for (auto& s : f.series) {
      if (s->labels == labels && !s->fn) return s.get();
    }
    f.series.push_back(std::make_unique<Series>());
    f.series.back()->labels = labels;
    return f.series.back().get();
  }
};

MetricsRegistry::MetricsRegistry() : impl_(std::make_unique<Impl>()) {}
MetricsRegistry::~MetricsRegistry() = default;

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const Labels& labels) {
  std::lock_guard lock(impl_->mu);
  Series* s = impl_->Find(name, Kind::kCounter, help, labels);
  if (!s->counter) s->counter = std::make_unique<Counter>();
  return s->counter.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const Labels& labels) {
  std::lock_guard lock(impl_->mu);
  Series* s = impl_->Find(name, Kind::kGauge, help, labels);
  if (!s->gauge) s->gauge = std::make_unique<Gauge>();
  return s->gauge.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const Labels& labels, std::vector<double> bounds) {
  std::lock_guard lock(impl_->mu);
  Series* s = impl_->Find(name, Kind::kHistogram, help, labels);
  if (!s->histogram) s->histogram = std::make_unique<Histogram>(std::move(bounds));
  return s->histogram.get();
}

void MetricsRegistry::AddCallbackGauge(const std::string& name, const std::string& help,
                                       const Labels& labels, std::function<double()> fn,
                                       const void* owner) {
  std::lock_guard lock(impl_->mu);
  auto [it, inserted] = impl_->families.try_emplace(name);
  Family& f = it->second;
  if (inserted) {
    f.kind = Kind::kGauge;
    f.help = help;
  }
  KVPOOL_CHECK(f.kind == Kind::kGauge);
  auto s = std::make_unique<Series>();
  s->labels = labels;
  s->fn = std::move(fn);
  s->owner = owner;
  f.series.push_back(std::move(s));
}

void MetricsRegistry::RemoveCallbacks(const void* owner) {
  std::lock_guard lock(impl_->mu);
  for (auto& [name, f] : impl_->families) {
    std::erase_if(f.series, [&](const auto& s) { return s->fn && s->owner == owner; });
  }
}

std::string MetricsRegistry::RenderPrometheus() const {
  std::lock_guard lock(impl_->mu);
  std::string out;
  for (const auto& [name, f] : impl_->families) {
    if (f.series.empty()) continue;
    const char* type = f.kind == Kind::kCounter ? "counter"
                       : f.kind == Kind::kGauge ? "gauge"
                                                : "histogram";
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, EscapeHelp(f.help), name, type);
    for (const auto& s : f.series) {
      switch (f.kind) {
        case Kind::kCounter:
          out += fmt::format("{}{} {}\n", name, LabelText(s->labels), s->counter->Value());
          break;
        case Kind::kGauge:
          out += fmt::format("{}{} {}\n", name, LabelText(s->labels),
                             s->fn ? FormatNumber(s->fn()) : FormatNumber(s->gauge->Value()));
          break;
        case Kind::kHistogram: {
          const Histogram& h = *s->histogram;
          auto cum = h.CumulativeCounts();
          for (size_t i = 0; i < h.bounds().size(); ++i) {
            out += fmt::format("{}_bucket{} {}\n", name,
                               LabelText(s->labels, "le", FormatNumber(h.bounds()[i])), cum[i]);
          }
          out += fmt::format("{}_bucket{} {}\n", name, LabelText(s->labels, "le", "+Inf"),
                             cum.back());
          out += fmt::format("{}_sum{} {}\n", name, LabelText(s->labels), FormatNumber(h.Sum()));
          out += fmt::format("{}_count{} {}\n", name, LabelText(s->labels), cum.back());
          break;
        }
      }
    }
  }
  return out;
}

double MetricsRegistry::ValueOf(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->families.find(name);
  if (it == impl_->families.end()) return -1;
  for (const auto& s : it->second.series) {
    if (s->labels != labels) continue;
    if (s->counter) return static_cast<double>(s->counter->Value());
    if (s->gauge) return static_cast<double>(s->gauge->Value());
    if (s->fn) return s->fn();
    if (s->histogram) return static_cast<double>(s->histogram->Count());
  }
  return -1;
}

double MetricsRegistry::SumOf(const std::string& name) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->families.find(name);
  if (it == impl_->families.end()) return -1;
  double sum = 0;
  for (const auto& s : it->second.series) {
    if (s->counter) sum += static_cast<double>(s->counter->Value());
    if (s->gauge) sum += static_cast<double>(s->gauge->Value());
    if (s->fn) sum += s->fn();
  }
  return sum;
}

bool MetricsRegistry::HistogramSumOf(const std::string& name, std::vector<double>* bounds,
                                     std::vector<uint64_t>* cumulative) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->families.find(name);
  if (it == impl_->families.end()) return false;
  bounds->clear();
  cumulative->clear();
  bool any = false;
  for (const auto& s : it->second.series) {
    if (!s->histogram) continue;
    const std::vector<uint64_t> c = s->histogram->CumulativeCounts();
    if (!any) {
      *bounds = s->histogram->bounds();
      cumulative->assign(c.size(), 0);
      any = true;
    } else if (s->histogram->bounds() != *bounds) {
      return false;
    }
    for (size_t i = 0; i < c.size(); ++i) (*cumulative)[i] += c[i];
  }
  return any;
}

}  // namespace kvpool
