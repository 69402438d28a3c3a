#include "base/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace paraflow {

namespace {

// Prometheus floats: integers without a fraction, +Inf/-Inf/NaN spelled its way.
std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

// {a="b",c="d"}, values escaped as the format asks; "" for no labels.
std::string render_labels(const MetricsRegistry::Labels& labels) {
  if (labels.empty()) return "";
  std::string rendered;
  for (const auto& [label, value] : labels) {
    std::string escaped;
    for (char c : value) {
      if (c == '\\' || c == '"') escaped += '\\';
      escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    rendered += fmt::format("{}{}=\"{}\"", rendered.empty() ? "" : ",", label, escaped);
  }
  return "{" + rendered + "}";
}

}  // namespace

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
  std::lock_guard lock(mutex_);
  Family& family = families_[name];
  family.help = help;
  family.type = "counter";
  std::unique_ptr<Counter>& series = family.labelled[render_labels(labels)];
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

std::string MetricsRegistry::render() const { return render_metrics({{this, {}}}); }

void MetricsRegistry::render_family(const std::string& name, const std::string& constant_labels,
                                    std::string& text) const {
  std::lock_guard lock(mutex_);
  const auto found = families_.find(name);
  if (found == families_.end()) return;
  const Family& family = found->second;
  // A series' labels: the constant ones first, then its own ("{a=\"b\"}" strings joined).
  auto labelled = [&](const std::string& own) {
    if (constant_labels.empty()) return own;
    if (own.empty()) return constant_labels;
    return constant_labels.substr(0, constant_labels.size() - 1) + "," + own.substr(1);
  };
  if (family.counter) {
    text += fmt::format("{}{} {}\n", name, labelled(""), number(family.counter->value()));
  } else if (!family.labelled.empty()) {
    for (const auto& [labels, series] : family.labelled) {
      text += fmt::format("{}{} {}\n", name, labelled(labels), number(series->value()));
    }
  } else if (family.histogram) {
    Histogram::Snapshot s = family.histogram->snapshot();
    for (size_t i = 0; i <= s.upper_bounds.size(); ++i) {
      const std::string bound = i < s.upper_bounds.size() ? number(s.upper_bounds[i]) : "+Inf";
      text += fmt::format("{}_bucket{} {}\n", name, labelled(fmt::format("{{le=\"{}\"}}", bound)), s.cumulative_counts[i]);
    }
    text += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, labelled(""), number(s.sum), name, labelled(""), s.count);
  } else {
    text += fmt::format("{}{} {}\n", name, labelled(""), number(family.read()));
  }
}

std::string render_metrics(const std::vector<LabelledMetrics>& sources) {
  // Every family once, with its series from each source: the format allows a name one block.
  std::map<std::string, std::pair<std::string, std::string>> families;  // name -> help, type
  for (const LabelledMetrics& source : sources) {
    std::lock_guard lock(source.registry->mutex_);
    for (const auto& [name, family] : source.registry->families_) families.try_emplace(name, family.help, family.type);
  }
  std::string text;
  for (const auto& [name, description] : families) {
    text += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, description.first, name, description.second);
    for (const LabelledMetrics& source : sources) source.registry->render_family(name, render_labels(source.labels), text);
  }
  return text;
}

}  // namespace paraflow
