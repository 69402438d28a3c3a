#include "base/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace paraflow {

void Counter::add(double amount) {
  double current = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

double Counter::value() const { return value_.load(std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot snapshot{upper_bounds_, {}, sum_, count_};
  uint64_t running = 0;
  for (uint64_t count : counts_) snapshot.cumulative_counts.push_back(running += count);
  return snapshot;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10, 20, 60};
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help) {
  std::lock_guard lock(mutex_);
  Family& family = families_[name];
  if (!family.counter) {
    family.help = help;
    family.type = "counter";
    family.counter = std::make_unique<Counter>();
  }
  return *family.counter;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::string rendered;
  for (const auto& [label, value] : labels) {
    std::string escaped;
    for (char c : value) {
      if (c == '\\' || c == '"') escaped += '\\';
      escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    rendered += fmt::format("{}{}=\"{}\"", rendered.empty() ? "" : ",", label, escaped);
  }
  std::lock_guard lock(mutex_);
  Family& family = families_[name];
  family.help = help;
  family.type = "counter";
  std::unique_ptr<Counter>& series = family.labelled["{" + rendered + "}"];
  if (!series) series = std::make_unique<Counter>();
  return *series;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      std::vector<double> upper_bounds) {
  std::lock_guard lock(mutex_);
  Family& family = families_[name];
  if (!family.histogram) {
    family.help = help;
    family.type = "histogram";
    family.histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  }
  return *family.histogram;
}

void MetricsRegistry::gauge(const std::string& name, const std::string& help, std::function<double()> read) {
  std::lock_guard lock(mutex_);
  Family& family = families_[name];
  family.help = help;
  family.type = "gauge";
  family.read = std::move(read);
}

namespace {

// Prometheus floats: integers without a fraction, +Inf/-Inf/NaN spelled its way.
std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

}  // namespace

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::string text;
  for (const auto& [name, family] : families_) {
    text += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, family.help, name, family.type);
    if (family.counter) {
      text += fmt::format("{} {}\n", name, number(family.counter->value()));
    } else if (!family.labelled.empty()) {
      for (const auto& [labels, series] : family.labelled) {
        text += fmt::format("{}{} {}\n", name, labels, number(series->value()));
      }
    } else if (family.histogram) {
      Histogram::Snapshot s = family.histogram->snapshot();
      for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
        text += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(s.upper_bounds[i]), s.cumulative_counts[i]);
      }
      text += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, s.cumulative_counts.back());
      text += fmt::format("{}_sum {}\n{}_count {}\n", name, number(s.sum), name, s.count);
    } else {
      text += fmt::format("{} {}\n", name, number(family.read()));
    }
  }
  return text;
}

}  // namespace paraflow
