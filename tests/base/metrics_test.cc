// Prometheus' text exposition format, checked against text written by hand from the format's
// rules; tests/serve/metrics_check.py also reads a live server's with prometheus_client's parser.
#include "base/metrics.h"

#include <gtest/gtest.h>

namespace paraflow {
namespace {

TEST(Metrics, RegistriesMergeIntoOneBlockPerFamily) {
  MetricsRegistry first, second, own;
  first.counter("tokens_total", "Tokens").add(3);
  second.counter("tokens_total", "Tokens").add(4);
  Histogram& latency = second.histogram("latency_seconds", "Latency", {0.5});
  latency.observe(0.25);
  latency.observe(2);
  own.counter("http_total", "Answers", {{"code", "200"}}).add();
  second.gauge("blocks", "Blocks", [] { return 7.0; });

  const std::string text = render_metrics({{&first, {{"model", "a"}, {"version", "1"}}},
                                           {&second, {{"model", "a\"b"}, {"version", "2"}}},
                                           {&own, {}}});
  EXPECT_EQ(text,
            "# HELP blocks Blocks\n# TYPE blocks gauge\n"
            "blocks{model=\"a\\\"b\",version=\"2\"} 7\n"
            "# HELP http_total Answers\n# TYPE http_total counter\n"
            "http_total{code=\"200\"} 1\n"
            "# HELP latency_seconds Latency\n# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{model=\"a\\\"b\",version=\"2\",le=\"0.5\"} 1\n"
            "latency_seconds_bucket{model=\"a\\\"b\",version=\"2\",le=\"+Inf\"} 2\n"
            "latency_seconds_sum{model=\"a\\\"b\",version=\"2\"} 2.25\n"
            "latency_seconds_count{model=\"a\\\"b\",version=\"2\"} 2\n"
            "# HELP tokens_total Tokens\n# TYPE tokens_total counter\n"
            "tokens_total{model=\"a\",version=\"1\"} 3\n"
            "tokens_total{model=\"a\\\"b\",version=\"2\"} 4\n");
  EXPECT_EQ(own.render(), "# HELP http_total Answers\n# TYPE http_total counter\nhttp_total{code=\"200\"} 1\n");
}

}  // namespace
}  // namespace paraflow
