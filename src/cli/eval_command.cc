#include <fmt/format.h>
#include <omp.h>

#include <memory>

#include "cli/commands.h"
#include "cli/stop_signal.h"
#include "cli/run_setup.h"
#include "train/evaluator.h"

namespace paraflow::cli {

namespace {

struct EvalOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string checkpoint;
  std::string watch;
  int threads = 0;
};

void run_eval(const EvalOptions& options) {
  RunSetup setup = RunSetup::load(options.config_path, options.overrides);
  int threads = options.threads > 0 ? options.threads : setup.threads;
  if (threads > 0) omp_set_num_threads(threads);
  std::unique_ptr<train::BatchSource> data = setup.open_data();
  train::Evaluator evaluator(setup.model, *data, cpu_backend(), setup.train);
  if (!options.watch.empty()) {
    const std::atomic<bool>* stop = stop_requests("finishing this evaluation");
    fmt::print(stderr, "evaluator: watching {} for checkpoints up to step {}\n", options.watch, setup.train.steps);
    evaluator.watch(options.watch, setup.train.steps, stop);
    return;
  }
  train::EvalResult result = evaluator.evaluate_dir(options.checkpoint);
  fmt::print("val loss {:.4f} | perplexity {:.3f} | {} batches of {}x{}\n", result.loss, result.perplexity,
             setup.train.eval_batches, setup.train.batch_size, setup.train.sequence_length);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  CLI::App* command = app.add_subcommand("eval", "Evaluate a checkpoint on the validation split, or follow a run");
  add_config_option(command, options->config_path, "The run's YAML config");
  command->add_option("--set", options->overrides, "Override a config key (repeatable)");
  auto* checkpoint = command->add_option("--checkpoint", options->checkpoint, "A checkpoint or export dir")
                         ->check(CLI::ExistingDirectory);
  auto* watch = command->add_option("--watch", options->watch,
                                    "A run dir (train.out_dir, which must exist): evaluate each new checkpoint, TensorBoard "
                                    "summaries in <dir>/eval")
                    ->check(CLI::ExistingDirectory);
  checkpoint->excludes(watch);
  command->add_option("--threads", options->threads, "CPU threads (default: all cores)")->check(in_range(at_least(0)));
  command->callback([options] {
    if (options->checkpoint.empty() && options->watch.empty()) throw CLI::ValidationError("give --checkpoint or --watch");
    run_eval(*options);
  });
}

}  // namespace paraflow::cli
