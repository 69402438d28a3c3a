#include <fmt/format.h>
#include <omp.h>

#include <atomic>
#include <csignal>
#include <memory>

#include "base/config.h"
#include "cli/commands.h"
#include "train/trainer.h"

namespace paraflow::cli {

namespace {

// Set by SIGTERM/SIGINT; the trainer checks it between steps, saves a checkpoint and exits 0.
std::atomic<bool> stop_requested{false};

void request_stop(int) { stop_requested.store(true); }

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = 0;
};

void run_train(const TrainOptions& options) {
  Config config = Config::from_file(options.config_path);
  for (const std::string& assignment : options.overrides) config.set(assignment);
  int threads = options.threads > 0 ? options.threads : config.get<int>("train.threads", 0);
  if (threads > 0) omp_set_num_threads(threads);

  model::GptConfig model_config = model::GptConfig::from_config(config);
  train::TrainConfig train_config = train::TrainConfig::from_config(config);
  std::string data_path = config.require<std::string>("data.train");
  double validation_fraction = config.get<double>("data.validation_fraction", 0.05);
  config.check_all_used();

  train::TokenSource data = train::TokenSource::from_text_files(data_path, validation_fraction);
  fmt::print(stderr, "data: {} train / {} validation tokens from {}\n", data.train_tokens(), data.validation_tokens(),
             data_path);
  fmt::print(stderr, "model: {:.2f}M parameters, {} layers, {} heads, n_embd {}; {} threads\n",
             static_cast<double>(model_config.parameter_count()) / 1e6, model_config.n_layer, model_config.n_head,
             model_config.n_embd, omp_get_max_threads());

  Backend& backend = cpu_backend();
  train::Trainer trainer(model_config, train_config, data, backend);
  trainer.initialize_or_resume();
  double peak = train::measure_peak_flops(backend);
  fmt::print(stderr, "measured sgemm peak: {:.1f} GFLOP/s (MFU is relative to it)\n", peak / 1e9);

  std::signal(SIGTERM, request_stop);
  std::signal(SIGINT, request_stop);
  trainer.run(&stop_requested, peak);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* command = app.add_subcommand("train", "Train a GPT-2-architecture model from a YAML config");
  command->add_option("--config", options->config_path, "YAML config (see configs/)")->required()->check(CLI::ExistingFile);
  command->add_option("--set", options->overrides, "Override a config key: --set train.lr=3e-4 (repeatable)");
  command->add_option("--threads", options->threads, "CPU threads (default: all cores, or train.threads)");
  command->callback([options] { run_train(*options); });
}

}  // namespace paraflow::cli
