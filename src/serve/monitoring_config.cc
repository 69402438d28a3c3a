#include "serve/monitoring_config.h"

#include "base/error.h"
#include "base/file_io.h"
#include "serve/text_proto.h"
#include "tensorflow_serving/config/monitoring_config.pb.h"

namespace paraflow::serve {

std::optional<std::string> read_monitoring_config(const std::string& file) {
  tensorflow::serving::MonitoringConfig config;
  parse_text_proto(read_file(file), config, "--monitoring_config_file " + file);
  const tensorflow::serving::PrometheusConfig& prometheus = config.prometheus_config();
  if (!prometheus.enable()) return std::nullopt;
  if (prometheus.path().empty()) return "/monitoring/prometheus/metrics";
  check(prometheus.path().starts_with("/"), "--monitoring_config_file {}: prometheus_config.path \"{}\" must start with '/'",
        file, prometheus.path());
  return prometheus.path();
}

}  // namespace paraflow::serve
