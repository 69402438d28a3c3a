// TF Serving's `--monitoring_config_file` (MonitoringConfig,
// serve/proto/tensorflow_serving/config/monitoring_config.proto), e.g.
//   prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }
#pragma once

#include <optional>
#include <string>

namespace paraflow::serve {

// The HTTP path a MonitoringConfig file serves Prometheus' metrics at (TF Serving's default
// /monitoring/prometheus/metrics when `path` is empty); nullopt when prometheus_config is not
// enabled. Throws InputError naming the file, and IoError when it cannot be read.
std::optional<std::string> read_monitoring_config(const std::string& file);

}  // namespace paraflow::serve
