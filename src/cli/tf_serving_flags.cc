#include "cli/tf_serving_flags.h"

#include <fmt/format.h>

#include "cli/commands.h"

namespace paraflow::cli {

namespace {

// A flag of TF Serving's that has no meaning here: accepted (with a value, or bare when it is a
// boolean), and `why` said when the server starts.
void accept_with_note(CLI::App& command, TfServingFlags& flags, const std::string& name, bool boolean,
                      const std::string& why) {
  const std::string note = fmt::format("{}: accepted for TF Serving's command lines; {}", name, why);
  auto remember = [&flags, note] { flags.notes.push_back(note); };
  const std::string help = "TF Serving's; " + why;
  if (boolean) {
    command.add_flag_callback(name, remember, help);  // called for true only (--flag, --flag=true)
  } else {
    command.add_option_function<std::string>(name, [remember](const std::string&) { remember(); }, help);
  }
}

}  // namespace

void add_tf_serving_flags(CLI::App& command, TfServingFlags& flags) {
  command.add_option("--rest_api_port", flags.rest_api_port,
                     "TF Serving's REST port: the HTTP port (OpenAI and TF Serving REST APIs); --port then "
                     "names the gRPC port, as in TF Serving")
      ->check(in_range(between(0, 65535)));
  command.add_option("--tensorflow_intra_op_parallelism", flags.intra_op_threads,
                     "TF Serving's compute threads: --threads (0: all cores)")
      ->check(in_range(at_least(0)));
  command.add_option("--rest_api_num_threads", flags.rest_api_num_threads, "Threads serving HTTP connections")
      ->check(in_range(between(1, 1024)));
  command.add_option("--rest_api_timeout_in_ms", flags.rest_api_timeout_ms,
                     "Milliseconds a REST :predict may take from its arrival; later it stops and answers 504 "
                     "(0: no limit)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command.add_option("--monitoring_config_file", flags.monitoring_config_file,
                     "TF Serving's MonitoringConfig (protobuf text): prometheus_config { enable: true path: ... } "
                     "serves the metrics at that path as well as /metrics")
      ->check(CLI::ExistingFile);
  command.add_flag("--allow_version_labels_for_unavailable_models", flags.allow_unavailable_labels,
                   "Let a version label name a version that is not available (yet); without it, such a label "
                   "is refused at start and on a config reload");
  command.add_option("--model_config_file_poll_wait_seconds", flags.config_poll_seconds,
                     "Seconds between reads of --model_config_file: models added, removed, policies and labels "
                     "changed while serving (0: read at start only)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  accept_with_note(command, flags, "--enable_model_warmup", true,
                   "paraflow's models need no warmup requests (assets.extra is not read)");
  accept_with_note(command, flags, "--tensorflow_inter_op_parallelism", false,
                   "there are no TensorFlow ops to run side by side (--threads sets the compute threads)");
}

void apply_tf_serving_flags(const CLI::App& command, const TfServingFlags& flags, ServerSettings settings,
                            const std::function<void(const std::string&)>& say) {
  if (flags.rest_api_port >= 0) {
    if (command.count("--port") > 0) {
      check(command.count("--grpc-port") == 0,
            "--port {} with --rest_api_port is TF Serving's gRPC port, and --grpc-port {} names another: give one",
            settings.http_port, settings.grpc_port);
      settings.grpc_port = settings.http_port;
      settings.grpc_flag = "--port";
    }
    settings.http_port = flags.rest_api_port;
  }
  if (flags.intra_op_threads >= 0) {
    check(command.count("--threads") == 0, "give --threads or --tensorflow_intra_op_parallelism, not both");
    settings.threads = flags.intra_op_threads;
  }
  if (flags.rest_api_num_threads > 0) settings.io_threads = flags.rest_api_num_threads;
  for (const std::string& note : flags.notes) say(note);
}

}  // namespace paraflow::cli
