// TF Serving's own flags on `paraflow serve`, so that a TF Serving command line (its Docker
// image's included: `--port=8500 --rest_api_port=8501 --model_name=... --model_base_path=...`)
// works as it is. Those that map onto this server take effect; those that mean nothing here
// are accepted and the server says so in its log. (--model_base_path, --model_name,
// --model_config_file, --enable_batching, --batching_parameters_file and
// --file_system_poll_wait_seconds are serve's own options.)
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace paraflow::cli {

struct TfServingFlags {
  int rest_api_port = -1;          // given: the HTTP port, and --port is then gRPC's, as in TF Serving
  int intra_op_threads = -1;       // --tensorflow_intra_op_parallelism: the compute threads
  int rest_api_num_threads = -1;   // the HTTP server's threads
  int64_t rest_api_timeout_ms = 0;  // a REST :predict's time limit; 0: none
  std::string monitoring_config_file;  // prometheus_config's path serves /metrics too
  bool allow_unavailable_labels = false;  // --allow_version_labels_for_unavailable_models
  double config_poll_seconds = 0;  // --model_config_file_poll_wait_seconds; 0: read once
  std::vector<std::string> notes;  // what the flags given that change nothing here are said to mean
};

void add_tf_serving_flags(CLI::App& command, TfServingFlags& flags);

// The server's settings the flags given change: the ports (with --rest_api_port, --port names the
// gRPC port; --grpc-port as well is refused), the compute and HTTP threads. Says the notes.
// Throws InputError naming the flags that contradict each other.
struct ServerSettings {
  int& http_port;
  int& grpc_port;
  std::string& grpc_flag;  // the flag that named the gRPC port, for errors
  int& threads;
  int& io_threads;
};
void apply_tf_serving_flags(const CLI::App& command, const TfServingFlags& flags, ServerSettings settings,
                            const std::function<void(const std::string&)>& say);

}  // namespace paraflow::cli
