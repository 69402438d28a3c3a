#include <fmt/format.h>
#include <omp.h>

#include <memory>

#include "cli/commands.h"
#include "cli/run_setup.h"
#include "train/memory_report.h"

namespace paraflow::cli {

namespace {

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int ranks = 1;
  int threads = 0;
  double budget_gib = 0;
};

// The largest value in [low, high] (a multiple of `step`) for which fits() holds, or 0.
int64_t largest_fitting(int64_t low, int64_t high, int64_t step, const std::function<bool(int64_t)>& fits) {
  if (!fits(low)) return 0;
  int64_t good = low, bad = high + step;
  while (bad - good > step) {
    int64_t middle = (good + bad) / 2 / step * step;
    if (middle <= good) middle = good + step;
    (fits(middle) ? good : bad) = middle;
  }
  return good;
}

void run_plan(const PlanOptions& options) {
  RunSetup setup = RunSetup::load(options.config_path, options.overrides);
  const int threads = options.threads > 0 ? options.threads : (setup.threads > 0 ? setup.threads : omp_get_max_threads());
  const train::TrainConfig& config = setup.train;
  check(config.batch_size % (options.ranks * config.grad_accumulation) == 0,
        "train.batch_size ({}) must be a multiple of --ranks ({}) x train.grad_accumulation ({})", config.batch_size,
        options.ranks, config.grad_accumulation);
  train::MemoryReport report = train::estimate_training_memory(setup.model, config, options.ranks, threads);
  fmt::print("model: {:.2f}M parameters; micro-batch {} x {} per rank, {} rank(s), recompute: {}\n",
             static_cast<double>(setup.model.parameter_count()) / 1e6,
             config.batch_size / (options.ranks * config.grad_accumulation), config.sequence_length, options.ranks,
             config.recompute);
  fmt::print("{}", report.to_text());
  fmt::print("allocated by a training step (activations, inputs, workspace): {:.1f} MiB\n",
             static_cast<double>(report.step_allocations()) / (1 << 20));
  const double per_token = setup.model.flops_per_token(config.sequence_length);
  fmt::print("FLOPs per token {:.3e}; per step {:.3e} ({} tokens)\n", per_token,
             per_token * static_cast<double>(config.batch_size * config.sequence_length),
             config.batch_size * config.sequence_length);
  if (options.budget_gib <= 0) return;
  const auto budget = static_cast<int64_t>(options.budget_gib * (1 << 30));
  const int64_t unit = options.ranks * config.grad_accumulation;
  auto fits_batch = [&](int64_t batch) {
    train::TrainConfig trial = config;
    trial.batch_size = batch;
    return train::estimate_training_memory(setup.model, trial, options.ranks, threads).total() <= budget;
  };
  auto fits_sequence = [&](int64_t sequence) {
    train::TrainConfig trial = config;
    trial.sequence_length = sequence;
    return train::estimate_training_memory(setup.model, trial, options.ranks, threads).total() <= budget;
  };
  int64_t batch = largest_fitting(unit, unit * 4096, unit, fits_batch);
  int64_t sequence = largest_fitting(1, setup.model.n_positions, 1, fits_sequence);
  fmt::print("budget {:.2f} GiB per rank: largest train.batch_size at sequence {}: {}\n", options.budget_gib,
             config.sequence_length, batch == 0 ? "none fits" : std::to_string(batch));
  fmt::print("budget {:.2f} GiB per rank: largest train.sequence_length at batch {}: {}{}\n", options.budget_gib,
             config.batch_size, sequence == 0 ? "none fits" : std::to_string(sequence),
             sequence == setup.model.n_positions ? " (= model.n_positions, the model's limit)" : "");
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command = app.add_subcommand("plan", "Memory and FLOP estimate of a training config, without training");
  command->add_option("--config", options->config_path, "YAML config")->required()->check(CLI::ExistingFile);
  command->add_option("--set", options->overrides, "Override a config key (repeatable)");
  command->add_option("--ranks", options->ranks, "Data-parallel ranks")->capture_default_str()->check(in_range(at_least(1)));
  command->add_option("--threads", options->threads, "Threads per rank (workspace); default: all cores")
      ->check(in_range(at_least(0)));
  command->add_option("--memory-budget", options->budget_gib, "GiB per rank: report the largest batch and sequence that fit")
      ->check(in_range(above(0)));
  command->callback([options] { run_plan(*options); });
}

}  // namespace paraflow::cli
