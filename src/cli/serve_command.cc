// `paraflow serve`: the OpenAI-compatible and TF Serving-compatible servers (src/serve) around
// the serving engine. The models: one export dir (--model), or TF Serving's layout of versions
// under a base path (--model_base_path, or several models in --model_config_file), polled for new
// versions. It listens before the models load (/health answers 503 until they are ready), serves
// until SIGTERM/SIGINT, then drains: no new connections or requests, in-flight ones finish within
// the grace period (the rest are cancelled with an error), answers are sent, and it exits 0.
// TF Serving's own flags work too (cli/tf_serving_flags.h), its config file reloads included.
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/memory_flags.h"
#include "cli/stop_signal.h"
#include "cli/tf_serving_flags.h"
#include "base/file_io.h"
#include "infer/engine.h"
#include "serve/config_file_watcher.h"
#include "serve/http_server.h"
#include "serve/model_registry.h"
#include "serve/openai_service.h"
#include "serve/monitoring_config.h"
#include "serve/tf_serving_grpc.h"

namespace paraflow::cli {

namespace {

struct ServeOptions {
  std::string model_dir;
  std::string model_base_path;
  std::string model_name = "default";  // with --model_base_path, as TF Serving names it
  std::string model_config_file;
  double poll_seconds = 1;
  bool enable_batching = false;
  std::string batching_parameters_file;
  std::string host = "127.0.0.1";
  int port = 8080;
  int grpc_port = -1;  // TF Serving's gRPC services; -1: off
  std::string grpc_flag = "--grpc-port";  // the flag that named it
  std::string served_model_name;  // default: the model dir's name
  std::string api_key;
  std::string allowed_origins;  // the pages' origins that may call the API (serve/cors.h); none by default
  std::string ssl_certfile, ssl_keyfile;  // HTTPS, as vLLM and llama-server take them
  std::string ssl_config_file;            // gRPC over TLS, as TF Serving takes it
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  infer::EngineOptions engine;
  serve::HttpLimits http;
  double read_timeout_seconds = 30;
  double grace_seconds = 30;
  TfServingFlags tf_serving;
};

// Each connection is a file descriptor: let the process have enough for the connection limit.
void allow_descriptors(size_t connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = std::min<rlim_t>(limit.rlim_max, connections + 256);
  if (limit.rlim_cur < wanted) {
    limit.rlim_cur = wanted;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

void say(const std::string& line) {
  fmt::print("paraflow serve: {}\n", line);
  std::fflush(stdout);
}

// What --model, --model_base_path or --model_config_file (its text: `config_text`) ask to serve.
std::vector<serve::ModelSource> model_sources(const ServeOptions& options, const std::string& config_text) {
  const int given = !options.model_dir.empty() + !options.model_base_path.empty() + !options.model_config_file.empty();
  if (given != 1) throw InputError("give one of --model, --model_base_path or --model_config_file");
  if (!options.model_config_file.empty()) return serve::parse_model_config(config_text, options.model_config_file);
  if (!options.model_base_path.empty()) {
    serve::check_base_path(options.model_base_path, "--model_base_path");
    return {{.name = options.model_name, .base_path = std::filesystem::absolute(options.model_base_path)}};
  }
  const std::filesystem::path dir = std::filesystem::weakly_canonical(options.model_dir);
  return {{.name = options.served_model_name.empty() ? dir.filename().string() : options.served_model_name,
           .base_path = dir,
           .single_version = true}};
}

void run_serve(ServeOptions options) {
  const std::atomic<bool>* stop = stop_requests("draining the requests in flight");
  check_kv_cache_fits(options.engine.kv_cache_gb);
  Backend& backend = cpu_backend();
  options.engine.weights = weights_dtype(options.dtype, backend);
  options.engine.kv_cache_dtype = kv_cache_dtype(options.kv_cache_dtype, options.engine.weights);
  std::optional<serve::BatchingOptions> batching;
  if (!options.batching_parameters_file.empty() && !options.enable_batching) {
    throw InputError("--batching_parameters_file is read only with --enable_batching");
  }
  if (options.enable_batching) {
    batching = options.batching_parameters_file.empty() ? serve::BatchingOptions{}
                                                        : serve::read_batching_parameters(options.batching_parameters_file);
  }
  auto load_version = [&](const serve::ModelSource&, int64_t, const std::filesystem::path& dir) {
    check_sequences_fit(options.engine, dir);
    return serve::load_export_dir(dir, backend, options.engine, batching);
  };
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds * 1000));
  const TfServingFlags& tf = options.tf_serving;
  if (tf.config_poll_seconds > 0 && options.model_config_file.empty()) {
    throw InputError("--model_config_file_poll_wait_seconds reads --model_config_file again: give that file too");
  }
  const std::string config_text = options.model_config_file.empty() ? "" : read_file(options.model_config_file);
  serve::ModelRegistry registry(model_sources(options, config_text), load_version, say, grace);

  serve::OpenAiService service(registry, options.api_key, serve::CorsPolicy::parse(options.allowed_origins));
  if (!tf.monitoring_config_file.empty()) {
    if (auto path = serve::read_monitoring_config(tf.monitoring_config_file)) service.serve_metrics_at(*path);
  }
  service.tf_serving().set_timeout(std::chrono::milliseconds(tf.rest_api_timeout_ms));
  options.http.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.read_timeout_seconds * 1000));
  allow_descriptors(options.http.max_connections);

  // Declared after the registry, so destroyed before it: the servers' last answers let go of the
  // versions they hold while the registry still owns them.
  serve::HttpServer server([&service](serve::HttpRequest request,
                                      std::shared_ptr<serve::Exchange> exchange) { service.handle(std::move(request), std::move(exchange)); },
                           [&service](const std::string& target, int status) { service.count(target, status); },
                           options.http);
  service.metrics().gauge("paraflow_http_connections", "Open HTTP connections",
                          [&server] { return static_cast<double>(server.connections()); });
  if (options.ssl_certfile.empty() != options.ssl_keyfile.empty()) {
    throw InputError("--ssl-certfile and --ssl-keyfile go together: give both, or neither");
  }
  if (!options.ssl_config_file.empty() && options.grpc_port < 0) throw InputError("--ssl_config_file is read only with --grpc-port");
  if (!options.ssl_certfile.empty()) server.use_tls(options.ssl_certfile, options.ssl_keyfile);
  server.listen(options.host, static_cast<uint16_t>(options.port));
  const std::string address =
      fmt::format("{}://{}:{}", options.ssl_certfile.empty() ? "http" : "https", options.host, server.port());
  say(fmt::format("listening on {}", address));

  // TF Serving's gRPC services (--grpc-port): the same lifecycle as HTTP.
  std::optional<serve::TfServingGrpc> grpc;
  if (options.grpc_port >= 0) {
    grpc.emplace(registry, options.api_key, tf.allow_unavailable_labels);
    int port = 0;
    try {
      port = grpc->listen(options.host, options.grpc_port, options.ssl_config_file);
    } catch (const IoError& error) {
      throw IoError(fmt::format("{} {}: {}", options.grpc_flag, options.grpc_port, error.what()));
    }
    say(fmt::format("grpc listening on {}:{}{}", options.host, port, options.ssl_config_file.empty() ? "" : " (TLS)"));
  }

  registry.poll();  // the first versions, before polling goes on in the background
  if (!tf.allow_unavailable_labels) registry.check_labels();
  if (options.model_dir.empty()) registry.start_polling(std::chrono::milliseconds(static_cast<int64_t>(options.poll_seconds * 1000)));
  std::optional<serve::ConfigFileWatcher> config_watcher;
  if (tf.config_poll_seconds > 0) {
    config_watcher.emplace(registry, options.model_config_file, config_text,
                           std::chrono::milliseconds(static_cast<int64_t>(tf.config_poll_seconds * 1000)),
                           tf.allow_unavailable_labels, say);
  }
  bool announced = false;
  while (!stop->load()) {
    if (!announced && registry.ready()) {
      announced = true;
      say(fmt::format("ready on {} ({} weights, {} KV cache)", address, dtype_word(options.engine.weights),
                      dtype_word(options.engine.kv_cache_dtype)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  say(fmt::format("stopping: finishing requests in flight (up to {} s)", options.grace_seconds));
  if (config_watcher) config_watcher->stop();
  service.draining();
  if (grpc) grpc->draining();
  server.stop_accepting();
  registry.drain(grace);
  if (grpc) grpc->stop(std::chrono::seconds(10));  // every call has its answer: the engines have drained
  server.stop(std::chrono::seconds(10));  // the last answers are written out
  say("stopped");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* command = app.add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API (continuous batching, paged KV cache)");
  command->add_option("--model", options->model_dir,
                      "Model dir (an export: config.json, model.safetensors, tokenizer) or a GGUF file (GPT-2, Llama, Mistral, Qwen2), served as version 1")
      ->check(CLI::ExistingPath);
  command->add_option("--model_base_path", options->model_base_path,
                      "TF Serving's layout: <path>/<version>/ export dirs, polled for new versions (newest served)");
  command->add_option("--model_name", options->model_name, "The --model_base_path model's name")->capture_default_str();
  command->add_option("--model_config_file", options->model_config_file,
                      "TF Serving's model config (ModelServerConfig, protobuf text): several models, version "
                      "policies, labels")
      ->check(CLI::ExistingFile);
  command->add_flag("--enable_batching", options->enable_batching,
                    "TF Serving's dynamic batching for Predict (REST :predict and gRPC), with its defaults or "
                    "--batching_parameters_file");
  command->add_option("--batching_parameters_file", options->batching_parameters_file,
                      "TF Serving's BatchingParameters (protobuf text): max_batch_size, batch_timeout_micros, "
                      "num_batch_threads, max_enqueued_batches, allowed_batch_sizes, pad_variable_length_inputs")
      ->check(CLI::ExistingFile);
  command->add_option("--file_system_poll_wait_seconds", options->poll_seconds,
                      "Seconds between polls of the base paths for new versions (0: at start only)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--host", options->host, "Address to listen on")->capture_default_str();
  command->add_option("--port", options->port,
                      "HTTP port (OpenAI and TF Serving REST APIs; 0: any free port); with --rest_api_port, the "
                      "gRPC port, as in TF Serving")
      ->capture_default_str()
      ->check(in_range(between(0, 65535)));
  command->add_option("--grpc-port", options->grpc_port,
                      "Also serve TF Serving's gRPC API (PredictionService, ModelService) on this port (0: any free "
                      "port); off unless given")
      ->check(in_range(between(0, 65535)));
  command->add_option("--served-model-name", options->served_model_name,
                      "The --model dir's name in the APIs (default: the dir's name)");
  command->add_option("--api-key", options->api_key, "Require Authorization: Bearer <key> on every endpoint but /health");
  command->add_option("--allowed-origins", options->allowed_origins,
                      "Origins whose web pages may call the API from a browser (CORS), as vLLM's flag: a JSON list "
                      "or comma-separated (http://localhost:3000,https://ui.example); * for any; none by default");
  command->add_option("--ssl-certfile", options->ssl_certfile, "HTTPS: the server's certificate (chain), PEM; with --ssl-keyfile")
      ->check(CLI::ExistingFile);
  command->add_option("--ssl-keyfile", options->ssl_keyfile, "HTTPS: the private key of --ssl-certfile, PEM")
      ->check(CLI::ExistingFile);
  command->add_option("--ssl_config_file", options->ssl_config_file,
                      "gRPC over TLS, as TF Serving: an SSLConfig (protobuf text) with server_key, server_cert, "
                      "custom_ca and client_verify")
      ->check(CLI::ExistingFile);
  command->add_option("--kv-cache-gb", options->engine.kv_cache_gb, "Memory for the KV cache's blocks, in GiB")
      ->capture_default_str()
      ->check(in_range(above(0)));
  command->add_option("--max-num-seqs", options->engine.max_num_seqs, "Sequences decoded together at most")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  command->add_option("--max-batched-tokens", options->engine.max_batched_tokens,
                      "Tokens per engine step at most (decode tokens plus prompt chunks); 0: the larger of 128 "
                      "and --max-num-seqs")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--max-decoding-step-tokens", options->engine.max_decoding_step_tokens,
                      "Tokens per step at most while a request is streaming (never fewer than the requests "
                      "running): lower keeps inter-token latency flatter, higher serves more tokens/s and "
                      "first tokens sooner; 0: the smaller of 32 and --max-batched-tokens")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--max-waiting", options->engine.max_waiting, "Queued requests beyond this are refused (429)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--threads", options->engine.threads, "CPU threads for compute (0: all cores)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  add_weights_dtype_option(command, options->dtype);
  command->add_option("--kv-cache-dtype", options->kv_cache_dtype,
                      "Keys and values in float32 or bfloat16 (twice the blocks in --kv-cache-gb); auto: as --dtype (bfloat16 for float16, q8_0 and q4_k)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16"}));
  command->add_option("--grace-seconds", options->grace_seconds,
                      "On SIGTERM/SIGINT, time for requests in flight to finish before they are cancelled")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--read-timeout", options->read_timeout_seconds,
                      "Seconds a client has to send a whole request (or the next one on a kept-alive connection)")
      ->capture_default_str()
      ->check(in_range(above(0)));
  command->add_option("--max-connections", options->http.max_connections, "Open connections at most (beyond: 503)")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  add_tf_serving_flags(*command, options->tf_serving);
  command->callback([options, command] {
    apply_tf_serving_flags(*command, options->tf_serving,
                           {options->port, options->grpc_port, options->grpc_flag, options->engine.threads, options->http.io_threads}, say);
    run_serve(*options);
  });
}

}  // namespace paraflow::cli
