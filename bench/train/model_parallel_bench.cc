// Model parallelism measured, under mpirun (ranks = shards x stages, one thread each): every
// stage's idle share of the pipeline phase (its bubble) next to the (p-1)/(m+p-1) model, its
// resident-memory growth over the first step next to `paraflow plan`'s prediction, and each
// shard's tensor-parallel all-reduce volume next to the model's count. Prints one `key value`
// line per rank for bench/train/pipeline_bubble.py and bench/train/tensor_parallel_comm.py.
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

#include <CLI/CLI.hpp>
#include <chrono>

#include "backend/cpu/gemm.h"
#include "dist/communicator.h"
#include "train/memory_report.h"
#include "train/step_time_model.h"
#include "train/trainer.h"
#include "bench_model.h"
#include "machine.h"

using namespace paraflow;

namespace {

// Resident memory now (not the peak: the chief's transient copy of the whole model at start-up
// would hide what the steps add).
double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident * sysconf(_SC_PAGESIZE)) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"paraflow pipeline benchmark (run under mpirun with one rank per stage)"};
  int64_t steps = 3, layers = 8, embd = 256, heads = 4, context = 128, vocab = 512, batch = 16, micro_batches = 4;
  std::string schedule = "1f1b";
  app.add_option("--steps", steps, "Measured steps (after one warm-up step)");
  app.add_option("--n-layer", layers);
  app.add_option("--n-embd", embd);
  app.add_option("--n-head", heads);
  app.add_option("--n-ctx", context);
  app.add_option("--vocab", vocab);
  app.add_option("--batch", batch, "Sequences per step");
  app.add_option("--micro-batches", micro_batches);
  app.add_option("--schedule", schedule, "gpipe or 1f1b");
  int shards = 1;
  app.add_option("--tensor-parallel", shards, "Shards per layer; the other factor of the ranks is stages");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<dist::Communicator> world = dist::make_mpi_communicator();
  const model::GptConfig config = bench::gpt_config(layers, embd, heads, context, vocab);
  train::TokenSource data = bench::random_tokens(vocab);
  train::TrainConfig train_config;
  train_config.batch_size = batch;
  train_config.sequence_length = context;
  train_config.steps = steps + 1;
  train_config.out_dir = "/tmp/paraflow-bench-unused";
  const int stages = world->size() / shards;
  train_config.tensor_parallel = shards;
  train_config.pipeline_parallel = stages;
  train_config.micro_batches = micro_batches;
  train_config.pipeline_schedule = train::parse_pipeline_schedule(schedule);
  // Equal stages: the blocks split evenly (the head is small at this vocabulary).
  train_config.stage_layers.assign(static_cast<size_t>(stages), layers / stages);

  train::Trainer trainer(config, train_config, data, cpu_backend(), *world);
  trainer.initialize_or_resume();
  const double rss_initialized = rss_mib();
  trainer.step();  // warm-up: the executors plan and allocate
  double compute = 0, transfers = 0, tensor_seconds = 0;
  int64_t tensor_bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    train::StepStats stats = trainer.step();
    compute += stats.pipeline.compute;
    transfers += stats.pipeline.transfers;
    tensor_bytes += stats.tensor_parallel_bytes;
    tensor_seconds += stats.tensor_parallel_seconds;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int rank = world->rank(), stage = rank / shards;
  const train::MemoryReport predicted =
      train::estimate_training_memory(config, train_config, world->size(), 1, {.tensor = rank % shards, .stage = stage});
  const double measured_bubble = stages > 1 ? transfers / (compute + transfers) : 0.0;
  const model::LayerRange range =
      train::partition_layers(config, stages, context, train_config.stage_layers)[static_cast<size_t>(stage)];
  // One line per stage, printed by rank 0 in order.
  std::string line = fmt::format(
      "stage {} shard {} schedule {} stages {} shards {} micro_batches {} bubble_measured {:.4f} bubble_model {:.4f} "
      "compute_ms {:.1f} transfers_ms {:.1f} in_flight {} rss_growth_mib {:.1f} predicted_step_mib {:.1f} "
      "parameters_state_mib {:.1f} tokens_per_s {:.0f} tp_bytes_measured {} tp_bytes_model {:.0f} tp_ms {:.1f}",
      stage, rank % shards, schedule, stages, shards, micro_batches, measured_bubble,
      train::pipeline_bubble(stages, micro_batches), 1000 * compute / static_cast<double>(steps),
      1000 * transfers / static_cast<double>(steps), predicted.in_flight, rss_mib() - rss_initialized,
      static_cast<double>(predicted.step_allocations()) / (1 << 20),
      static_cast<double>(predicted.parameters + predicted.gradients + predicted.optimizer_state) / (1 << 20),
      static_cast<double>(steps * batch * context) / seconds, tensor_bytes / steps,
      train::tensor_parallel_bytes_per_step(config, train_config, world->size(), range),
      1000 * tensor_seconds / static_cast<double>(steps));
  line.resize(400, ' ');
  std::vector<char> lines(400 * static_cast<size_t>(world->size()));
  if (rank == 0) std::copy(line.begin(), line.end(), lines.begin());
  for (int r = 1; r < world->size(); ++r) {
    if (rank == r) world->send(line.data(), 400, 0);
    if (rank == 0) world->recv(lines.data() + 400 * r, 400, r);
  }
  if (rank == 0) {
    fmt::print("cpu {}\nonednn_isa {}\n", bench::cpu_model(), cpu::onednn_isa_name());
    for (int r = 0; r < world->size(); ++r) {
      std::string text(lines.data() + 400 * r, 400);
      fmt::print("{}\n", text.substr(0, text.find_last_not_of(' ') + 1));
    }
  }
  return 0;
}
