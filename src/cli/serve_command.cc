// `paraflow serve`: the OpenAI-compatible HTTP server (src/serve) around the serving engine.
// It listens before the model loads (/health answers 503 until it is ready), serves until
// SIGTERM/SIGINT, then drains: no new connections or requests, in-flight ones finish within the
// grace period (the rest are cancelled with an error), answers are sent, and it exits 0.
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/stop_signal.h"
#include "infer/engine.h"
#include "infer/text_codec.h"
#include "model/model_files.h"
#include "serve/http_server.h"
#include "serve/openai_service.h"

namespace paraflow::cli {

namespace {

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string served_model_name;  // default: the model dir's name
  std::string api_key;
  std::string dtype = "auto";
  infer::EngineOptions engine;
  serve::HttpLimits http;
  double read_timeout_seconds = 30;
  double grace_seconds = 30;
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

void run_serve(ServeOptions options) {
  const std::atomic<bool>* stop = stop_requests();
  const std::filesystem::path model_dir = std::filesystem::weakly_canonical(options.model_dir);
  serve::OpenAiService service({.model_name = options.served_model_name.empty() ? model_dir.filename().string()
                                                                               : options.served_model_name,
                                .api_key = options.api_key});
  options.http.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.read_timeout_seconds * 1000));
  allow_descriptors(options.http.max_connections);

  serve::HttpServer server([&service](serve::HttpRequest request,
                                      std::shared_ptr<serve::Exchange> exchange) { service.handle(std::move(request), std::move(exchange)); },
                           [&service](const std::string& target, int status) { service.count(target, status); },
                           options.http);
  service.metrics().gauge("paraflow_http_connections", "Open HTTP connections",
                          [&server] { return static_cast<double>(server.connections()); });
  server.listen(options.host, static_cast<uint16_t>(options.port));
  const std::string address = fmt::format("http://{}:{}", options.host, server.port());
  say(fmt::format("listening on {}; loading {}", address, model_dir.string()));

  // Declared after the server, so destroyed before it: the engine's last sinks let go of their
  // connections while the server still owns them.
  Backend& backend = cpu_backend();
  model::LoadedModel model = model::load_model_dir(model_dir, backend);
  infer::TextCodec codec(model_dir);
  options.engine.weights = weights_dtype(options.dtype, backend);
  std::optional<infer::Engine> engine;
  engine.emplace(model.config, model.parameters, backend, options.engine);
  service.ready(*engine, codec);
  say(fmt::format("ready on {} (model {}, {} weights, {} KV blocks)", address, model_dir.filename().string(),
                  options.engine.weights == DType::bf16 ? "bfloat16" : "float32", engine->stats().blocks_total));

  while (!stop->load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  say(fmt::format("stopping: finishing requests in flight (up to {} s)", options.grace_seconds));
  service.draining();
  server.stop_accepting();
  engine->drain(std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds * 1000)));
  server.stop(std::chrono::seconds(10));  // the last answers are written out
  engine.reset();
  say("stopped");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* command = app.add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API (continuous batching, paged KV cache)");
  command->add_option("--model", options->model_dir, "Model dir (an export: config.json, model.safetensors, tokenizer)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--host", options->host, "Address to listen on")->capture_default_str();
  command->add_option("--port", options->port, "Port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(in_range(between(0, 65535)));
  command->add_option("--served-model-name", options->served_model_name, "The model's id in the API (default: the model dir's name)");
  command->add_option("--api-key", options->api_key, "Require Authorization: Bearer <key> on every endpoint but /health");
  command->add_option("--kv-cache-gb", options->engine.kv_cache_gb, "Memory for the KV cache's blocks, in GiB")
      ->capture_default_str()
      ->check(in_range(above(0)));
  command->add_option("--max-num-seqs", options->engine.max_num_seqs, "Sequences decoded together at most")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  command->add_option("--max-batched-tokens", options->engine.max_batched_tokens,
                      "Tokens per engine step at most (decode tokens plus prompt chunks)")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  command->add_option("--max-waiting", options->engine.max_waiting, "Queued requests beyond this are refused (429)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--threads", options->engine.threads, "CPU threads for compute (0: all cores)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--dtype", options->dtype,
                      "Weights in float32 or bfloat16; auto: bfloat16 where the CPU has bf16 GEMMs (AMX, AVX512_BF16)")
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
  command->callback([options] { run_serve(*options); });
}

}  // namespace paraflow::cli
