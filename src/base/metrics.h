// Metrics in Prometheus' text exposition format (version 0.0.4): counters, gauges (set, or read
// by a callback at scrape time) and histograms with fixed buckets. Thread-safe: the engine
// records from its thread while front ends scrape from theirs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace paraflow {

class Counter {
 public:
  void add(double amount = 1);
  double value() const;

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double value);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then the +Inf bucket
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Latency buckets in seconds, from 1 ms to 60 s.
std::vector<double> latency_buckets();

class MetricsRegistry {
 public:
  // Names follow Prometheus' conventions (snake_case, a unit suffix, counters ending in _total).
  // Registering a name twice returns the first metric.
  Counter& counter(const std::string& name, const std::string& help);
  // One series of a labelled counter family, e.g. paraflow_http_requests_total{code="200"}; label
  // values are escaped as the format asks. A name holds either unlabelled or labelled counters.
  using Labels = std::vector<std::pair<std::string, std::string>>;
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels);
  Histogram& histogram(const std::string& name, const std::string& help, std::vector<double> upper_bounds);
  void gauge(const std::string& name, const std::string& help, std::function<double()> read);

  std::string render() const;  // the text exposition format

 private:
  friend std::string render_metrics(const std::vector<struct LabelledMetrics>& sources);
  // The samples of family `name`, if this registry has it, each with `constant_labels` added.
  void render_family(const std::string& name, const std::string& constant_labels, std::string& text) const;

  struct Family {
    std::string help;
    std::string type;  // counter | gauge | histogram
    std::unique_ptr<Counter> counter;
    std::map<std::string, std::unique_ptr<Counter>> labelled;  // by rendered label set: {a="b",...}
    std::unique_ptr<Histogram> histogram;
    std::function<double()> read;
  };
  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

// A registry whose series all get the same extra labels, e.g. {model="gpt2", version="3"}.
struct LabelledMetrics {
  const MetricsRegistry* registry;
  MetricsRegistry::Labels labels;
};

// Several registries as one exposition: a family the registries share is written once, with the
// series of each (the format allows one block per name). HELP and TYPE come from the first.
std::string render_metrics(const std::vector<LabelledMetrics>& sources);

}  // namespace paraflow
