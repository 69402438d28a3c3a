#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <memory>

#include "cli/commands.h"
#include "cli/run_setup.h"
#include "dist/mesh.h"
#include "ps/task_memory.h"
#include "train/memory_report.h"
#include "train/pipeline_schedule.h"
#include "train/step_time_model.h"

namespace paraflow::cli {

namespace {

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int ranks = 1;
  int ps_tasks = 0;  // > 0: a parameter-server job of ps_tasks, `workers` and a chief
  int workers = 1;
  int threads = 0;
  double budget_gib = 0;
  double peak_tflops = 0;     // 0: measured on this machine's CPU
  double bandwidth_gbs = 10;        // between ranks, GB/s
  double tensor_bandwidth_gbs = 0;  // between a layer's shards (0: bandwidth_gbs)
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

// `value` in `unit` with the SI prefix that leaves 1 to 3 digits before the point, to 3
// significant digits: "35.2 GFLOP/s" and "4.1 ms" for a small model, not "0.0 TFLOP/s" and "0.000 s".
std::string with_si_prefix(double value, const char* unit) {
  static constexpr const char* kPrefixes[] = {"n", "u", "m", "", "k", "M", "G", "T", "P", "E"};
  int prefix = 3;
  while (value != 0 && std::abs(value) < 1 && prefix > 0) value *= 1000, --prefix;
  while (std::abs(value) >= 1000 && prefix < 9) value /= 1000, ++prefix;
  return fmt::format("{:.3g} {}{}", value, kPrefixes[prefix], unit);
}

// Memory per rank of each stage, and the modelled step time with its bubble and communication.
void print_layout(const RunSetup& setup, const PlanOptions& options, int threads) {
  const train::TrainConfig& config = setup.train;
  const int stages = config.pipeline_parallel;
  const dist::MeshShape mesh = dist::mesh_shape(options.ranks, config.tensor_parallel, stages);
  config.check_batch_split(options.ranks);
  fmt::print("model: {:.2f}M parameters; {} rank(s): {} shard(s) x {} stage(s) x {} data-parallel replica(s); "
             "micro-batch {} x {}, {} per step per replica; recompute: {}\n",
             static_cast<double>(setup.model.parameter_count()) / 1e6, options.ranks, mesh.tensor, stages, mesh.data,
             config.micro_batch(options.ranks), config.sequence_length, config.micro_batches_per_step(), config.recompute);
  if (stages == 1 && mesh.tensor == 1) {
    train::MemoryReport report = train::estimate_training_memory(setup.model, config, options.ranks, threads);
    fmt::print("{}", report.to_text());
    fmt::print("allocated by a training step (activations, inputs, workspace{}): {:.1f} MiB\n",
               report.zero_stage >= 2 ? ", gradients" : "", static_cast<double>(report.step_allocations()) / (1 << 20));
  } else {
    fmt::print("schedule {}: memory per rank (MiB)\n", train::pipeline_schedule_name(config.pipeline_schedule));
    fmt::print("{:>5} {:>9} {:>10} {:>10} {:>10} {:>9} {:>12} {:>10}\n", "stage", "blocks", "parameters", "gradients",
               "optimizer", "in flight", "activations", "total");
    const auto ranges = train::partition_layers(setup.model, stages, config.sequence_length, config.stage_layers);
    auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
    for (int stage = 0; stage < stages; ++stage) {
      const train::MemoryReport r = train::estimate_training_memory(setup.model, config, options.ranks, threads, {.stage = stage});
      const model::LayerRange& range = ranges[static_cast<size_t>(stage)];
      fmt::print("{:>5} {:>9} {:>10.1f} {:>10.1f} {:>10.1f} {:>9} {:>12.1f} {:>10.1f}\n", stage,
                 fmt::format("{}-{}{}", range.first_layer, range.end_layer, range.last ? "+h" : ""), mib(r.parameters),
                 mib(r.gradients), mib(r.optimizer_state), r.in_flight, mib(r.activations + r.inputs + r.workspace),
                 mib(r.total()));
    }
    fmt::print("(blocks a-b: [a, b); +h: the final layernorm and the head; activations include inputs and workspace{})\n",
               mesh.tensor > 1 ? "; per shard" : "");
  }
  fmt::print("whole run, peak growth of each rank's RSS (MiB; `train` prints the measured ones at its end):\n{}",
             train::rank_peaks_table(train::predict_rank_peaks(setup.model, config, options.ranks, threads)));
  const double peak = options.peak_tflops > 0 ? options.peak_tflops * 1e12 : train::measure_peak_flops(cpu_backend());
  const double tensor_gbs = options.tensor_bandwidth_gbs > 0 ? options.tensor_bandwidth_gbs : options.bandwidth_gbs;
  const train::StepTimeModel time =
      train::model_step_time(setup.model, config, options.ranks, peak, options.bandwidth_gbs * 1e9, tensor_gbs * 1e9);
  const double total = time.total();
  auto share = [&](double part) { return fmt::format("{} ({:.1f}%)", with_si_prefix(part, "s"), 100.0 * part / total); };
  fmt::print("modelled step at {}{}, {:.1f} GB/s between ranks{}: {}, {:.0f} tokens/s\n",
             with_si_prefix(peak, "FLOP/s"), options.peak_tflops > 0 ? "" : " (this CPU's measured f32 GEMM peak)", options.bandwidth_gbs,
             mesh.tensor > 1 ? fmt::format(" and {:.1f} GB/s between shards", tensor_gbs) : "", with_si_prefix(total, "s"),
             static_cast<double>(config.batch_size * config.sequence_length) / total);
  fmt::print("  compute {} | bubble {} | stage transfers {} | tensor-parallel all-reduces {} | gradient all-reduce {}\n",
             share(time.compute), share(time.bubble), share(time.pipeline_transfers), share(time.tensor_all_reduce),
             share(time.gradient_all_reduce));
  if (stages > 1) {
    fmt::print("  bubble model (p-1)/(m+p-1) = {:.3f}\n", train::pipeline_bubble(stages, config.micro_batches));
  }
}

// A parameter-server job: every task's whole run (the workers' steps are a one-process step's on
// their slice of the batch; the step-time model covers collective layouts only).
void print_parameter_server_job(const RunSetup& setup, const PlanOptions& options, int threads) {
  const train::TrainConfig& config = setup.train;
  check(options.budget_gib <= 0, "--memory-budget is for collective layouts; with --ps-tasks read each task's peak");
  check(!setup.ps_synchronous || config.batch_size % options.workers == 0,
        "train.batch_size ({}) must be a multiple of --workers ({}) in synchronous parameter-server mode",
        config.batch_size, options.workers);
  fmt::print("model: {:.2f}M parameters; a parameter-server job: a chief, {} worker(s), {} ps task(s), {} mode; "
             "batch {} x {}\n", static_cast<double>(setup.model.parameter_count()) / 1e6, options.workers,
             options.ps_tasks, setup.ps_synchronous ? "synchronous" : "asynchronous", config.batch_size,
             config.sequence_length);
  fmt::print("whole run, peak growth of each task's RSS (MiB; the chief's `train` prints the measured ones at its end):\n{}",
             train::rank_peaks_table(ps::predict_task_peaks(setup.model, config, options.ps_tasks, options.workers,
                                                            setup.ps_synchronous, threads),
                                     "tasks"));
}

void run_plan(const PlanOptions& options) {
  RunSetup setup = RunSetup::load(options.config_path, options.overrides);
  const int threads = options.threads > 0 ? options.threads : (setup.threads > 0 ? setup.threads : omp_get_max_threads());
  const train::TrainConfig& config = setup.train;
  if (options.ps_tasks > 0) return print_parameter_server_job(setup, options, threads);
  print_layout(setup, options, threads);
  const double per_token = setup.model.flops_per_token(config.sequence_length);
  fmt::print("FLOPs per token {:.3e}; per step {:.3e} ({} tokens)\n", per_token,
             per_token * static_cast<double>(config.batch_size * config.sequence_length),
             config.batch_size * config.sequence_length);
  if (options.budget_gib <= 0) return;
  const auto budget = static_cast<int64_t>(options.budget_gib * (1 << 30));
  const int stages = config.pipeline_parallel;
  const int64_t unit = config.replicas(options.ranks) * config.micro_batches_per_step();
  auto fits = [&](const train::TrainConfig& trial) {  // on every stage's ranks
    for (int stage = 0; stage < stages; ++stage) {
      const train::MemoryReport r = train::estimate_training_memory(setup.model, trial, options.ranks, threads, {.stage = stage});
      if (r.run.peak() > budget) return false;
    }
    return true;
  };
  auto fits_batch = [&](int64_t batch) {
    train::TrainConfig trial = config;
    trial.batch_size = batch;
    return fits(trial);
  };
  auto fits_sequence = [&](int64_t sequence) {
    train::TrainConfig trial = config;
    trial.sequence_length = sequence;
    return fits(trial);
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
  CLI::App* command = app.add_subcommand("plan", "Memory per rank, FLOPs and modelled step time of a training layout, without training");
  add_config_option(command, options->config_path, "YAML config");
  command->add_option("--set", options->overrides, "Override a config key (repeatable)");
  command->add_option("--ranks", options->ranks, "Ranks of the job (stages x data-parallel replicas)")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  command->add_option("--ps-tasks", options->ps_tasks,
                      "A parameter-server job with this many ps tasks (and --workers, and a chief): each task's peak")
      ->check(in_range(at_least(1)));
  command->add_option("--workers", options->workers, "Worker tasks of the parameter-server job (with --ps-tasks)")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  command->add_option("--threads", options->threads, "Threads per rank (workspace); default: all cores")
      ->check(in_range(at_least(0)));
  command->add_option("--memory-budget", options->budget_gib, "GiB per rank: report the largest batch and sequence that fit")
      ->check(in_range(above(0)));
  command->add_option("--peak-tflops", options->peak_tflops,
                      "GEMM throughput per rank for the step-time model (default: measured on this CPU)")
      ->check(in_range(above(0)));
  command->add_option("--bandwidth-gbs", options->bandwidth_gbs, "Link bandwidth between ranks, GB/s, for the model")
      ->capture_default_str()
      ->check(in_range(above(0)));
  command->add_option("--tensor-bandwidth-gbs", options->tensor_bandwidth_gbs,
                      "Link bandwidth between a layer's shards (consecutive ranks: one node), GB/s; default --bandwidth-gbs")
      ->check(in_range(above(0)));
  command->callback([options] { run_plan(*options); });
}

}  // namespace paraflow::cli
