#include "serve/tf_serving_config.h"

#include <fmt/format.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "base/error.h"
#include "base/file_io.h"
#include "tensorflow_serving/config/monitoring_config.pb.h"

namespace paraflow::serve {

namespace {

// Keeps the parser's first error with its place (the parser counts lines and columns from 0).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (message_.empty()) message_ = fmt::format("{}:{}: {}", line + 1, column + 1, message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

}  // namespace

void parse_text_proto(const std::string& text, const std::string& source, google::protobuf::Message& message) {
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &message)) {
    fail("{}:{}", source, errors.message().empty() ? " not a " + message.GetTypeName() + " message" : errors.message());
  }
}

std::optional<std::string> read_monitoring_config(const std::string& file) {
  tensorflow::serving::MonitoringConfig config;
  parse_text_proto(read_file(file), "--monitoring_config_file " + file, config);
  const tensorflow::serving::PrometheusConfig& prometheus = config.prometheus_config();
  if (!prometheus.enable()) return std::nullopt;
  if (prometheus.path().empty()) return "/monitoring/prometheus/metrics";
  check(prometheus.path().starts_with("/"), "--monitoring_config_file {}: prometheus_config.path \"{}\" must start with '/'",
        file, prometheus.path());
  return prometheus.path();
}

}  // namespace paraflow::serve
