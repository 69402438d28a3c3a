// Training throughput of paraflow on a GPT config (default: gpt-small of issue #2) or a Llama one
// (--arch llama: --n-kv-head, --intermediate, an untied head), with the
// sgemm peak of each CPU GEMM engine measured in the same run (before and after the timed steps,
// the better of the two), MFU against the best of them,
// and the peak RSS. Prints one `key value` per line for bench/train/compare_peers.py.
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "backend/cpu/gemm.h"
#include "dist/communicator.h"
#include "train/trainer.h"
#include "bench_model.h"
#include "machine.h"

using namespace paraflow;

int main(int argc, char** argv) {
  CLI::App app{"paraflow training benchmark"};
  int64_t steps = 10, warmup = 2, layers = 6, embd = 384, heads = 6, context = 256, vocab = 8192, batch = 8;
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--n-layer", layers);
  app.add_option("--n-embd", embd);
  app.add_option("--n-head", heads);
  app.add_option("--n-ctx", context);
  app.add_option("--vocab", vocab);
  app.add_option("--batch", batch, "Sequences per rank per step");
  std::string arch = "gpt2";
  int64_t kv_heads = 0, intermediate = 0;
  app.add_option("--arch", arch, "gpt2, or llama")->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--n-kv-head", kv_heads, "llama: k/v heads (0: --n-head)");
  app.add_option("--intermediate", intermediate, "llama: SwiGLU width (0: 4 * --n-embd)");
  bool overlap = true;
  app.add_option("--overlap", overlap, "All-reduce gradient buckets while backward runs");
  bool exact = false;
  app.add_option("--exact-reduction", exact, "Order-independent fixed-point gradient sums (dist.exact_reduction)");
  int zero = 0;
  app.add_option("--zero", zero, "ZeRO stage over the ranks (dist.zero): 0 to 3");
  int64_t accumulation = 1;
  app.add_option("--grad-accumulation", accumulation, "Micro-batches per rank per step (--batch sequences each)");
  bool profile = false;
  std::string recompute = "none";
  std::string precision = "float32";
  app.add_option("--precision", precision, "float32, mixed_bfloat16 or mixed_float16");
  app.add_option("--recompute", recompute, "Gradient checkpointing: none, block, attention or op kinds");
  app.add_flag("--profile", profile, "Print the time of each op kind for one extra step");
  CLI11_PARSE(app, argc, argv);

  Backend& backend = default_backend();  // the GPU where one is present (scripts/gpu_check.sh)
  // Under mpirun: data parallel over MPI, `--batch` per rank (weak scaling: the global batch grows).
  std::unique_ptr<dist::Communicator> communicator =
      dist::launched_by_mpi() ? dist::make_mpi_communicator() : dist::make_local_communicator();
  const int ranks = communicator->size();
  if (communicator->rank() == 0) {
    fmt::print("cpu {}\nonednn_isa {}\nopenblas_core {}\n", bench::cpu_model(), cpu::onednn_isa_name(),
               cpu::openblas_core_name());
  }
  // The GEMM peaks are probed before and after the timed steps, and the better of the two counts:
  // on a shared machine one probe can fall in a slow stretch (MFU read 1.14 once with a probe
  // taken before the steps only). Printed after the run, with the spread between the two probes.
  const cpu::GemmEngine chosen = cpu::gemm_engine();
  const DType gemms = train::gemm_dtype(graph::parse_precision_policy(precision), backend);
  const bool bf16_gemms = train::gemm_dtype(graph::PrecisionPolicy::mixed_bfloat16, backend) == DType::bf16;
  const std::vector<cpu::GemmEngine> engines{cpu::GemmEngine::openblas, cpu::GemmEngine::onednn,
                                            cpu::GemmEngine::onednn_matmul};
  struct Probe {
    std::vector<double> sgemm;  // per engine
    double bf16 = 0;
  };
  auto probe = [&] {
    Probe result;
    for (cpu::GemmEngine engine : engines) {
      cpu::set_gemm_engine(engine);
      result.sgemm.push_back(train::measure_peak_flops(backend, 2048));
    }
    cpu::set_gemm_engine(chosen);
    // mixed_bfloat16's MFU is against the bf16 GEMM peak, where the backend has bf16 GEMMs.
    if (bf16_gemms) result.bf16 = train::measure_peak_flops(backend, 2048, DType::bf16);
    return result;
  };
  const Probe before = probe();

  const model::GptConfig config =
      arch == "llama" ? bench::llama_config(layers, embd, heads, kv_heads > 0 ? kv_heads : heads,
                                            intermediate > 0 ? intermediate : 4 * embd, context, vocab)
                      : bench::gpt_config(layers, embd, heads, context, vocab);
  train::TokenSource data = bench::random_tokens(vocab);
  train::TrainConfig train_config;
  train_config.batch_size = batch;
  train_config.sequence_length = context;
  train_config.steps = steps + warmup;
  train_config.out_dir = "/tmp/paraflow-bench-unused";
  train_config.batch_size = batch * ranks * accumulation;
  train_config.grad_accumulation = accumulation;
  train_config.sync.zero = zero;
  train_config.sync.overlap = overlap;
  train_config.sync.exact = exact;
  train_config.recompute = recompute;
  train_config.precision = graph::parse_precision_policy(precision);
  train::Trainer trainer(config, train_config, data, backend, *communicator);
  trainer.initialize_or_resume();
  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  auto start = std::chrono::steady_clock::now();
  double communication_wait = 0;
  for (int64_t i = 0; i < steps; ++i) communication_wait += trainer.step().communication_wait;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (profile) {
    // One more step with per-op timing: where the time goes.
    trainer.executor().set_profiling(true);
    auto profiled_start = std::chrono::steady_clock::now();
    trainer.step();
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - profiled_start).count();
    double ops = 0;
    for (const auto& [key, value] : trainer.executor().profile()) {
      fmt::print("profile {:<26} {:7.1f} ms {:5.1f}%\n", key, value * 1000, 100 * value / total);
      ops += value;
    }
    fmt::print("profile {:<26} {:7.1f} ms {:5.1f}%\n", "(optimizer, data, rest)", (total - ops) * 1000,
               100 * (total - ops) / total);
  }
  const Probe after = probe();
  double peak = 0, spread = 1;
  for (size_t e = 0; e < engines.size(); ++e) {
    const double best = std::max(before.sgemm[e], after.sgemm[e]);
    if (communicator->rank() == 0) fmt::print("sgemm_gflops_{} {:.1f}\n", cpu::gemm_engine_name(engines[e]), best / 1e9);
    if (best > peak) spread = best / std::min(before.sgemm[e], after.sgemm[e]);
    peak = std::max(peak, best);
  }
  const double bf16_peak = std::max(before.bf16, after.bf16);
  if (communicator->rank() == 0 && bf16_peak > 0) fmt::print("bf16_gemm_gflops_onednn {:.1f}\n", bf16_peak / 1e9);
  if (communicator->rank() == 0) fmt::print("sgemm_peak_probe_spread {:.2f}\n", spread);
  double tokens_per_second = static_cast<double>(steps * batch * ranks * accumulation * context) / seconds;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  // Every rank's peak (start-up included), for the per-rank table: the largest and its rank; and
  // the largest resident set now, after the steps (what a rank holds between steps).
  float peak_mb = static_cast<float>(usage.ru_maxrss) / 1024.0f, largest_mb = peak_mb;
  communicator->all_reduce_max(&largest_mb, 1);
  float largest_rank = peak_mb == largest_mb ? static_cast<float>(communicator->rank()) : -1.0f;
  communicator->all_reduce_max(&largest_rank, 1);
  long pages = 0, resident_pages = 0;
  if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%ld %ld", &pages, &resident_pages) != 2) resident_pages = 0;
    std::fclose(statm);
  }
  float resident_mb = static_cast<float>(resident_pages) * static_cast<float>(sysconf(_SC_PAGESIZE)) / (1 << 20);
  communicator->all_reduce_max(&resident_mb, 1);
  if (communicator->rank() != 0) return 0;
  fmt::print("zero {}\ngrad_accumulation {}\npeak_rss_mb_largest {:.1f}\npeak_rss_largest_rank {}\nrss_after_steps_mb_largest {:.1f}\n",
             zero, accumulation, largest_mb, static_cast<int>(largest_rank), resident_mb);
  fmt::print("precision {}\nrecompute {}\nactivation_arena_mb {:.1f}\n", precision, recompute,
             static_cast<double>(trainer.executor().memory_plan().arena_bytes) / (1 << 20));
  fmt::print("ranks {}\ncommunication_wait_ms {:.1f}\n", ranks, 1000 * communication_wait / static_cast<double>(steps));
  const double model_flops = tokens_per_second * config.flops_per_token(context);
  fmt::print("gemm_engine {}\nthreads {}\nparameters {}\ntokens_per_s {:.1f}\nstep_ms {:.1f}\nmfu {:.4f}\npeak_rss_mb {:.1f}\n",
             cpu::gemm_engine_name(chosen), omp_get_max_threads(), config.parameter_count(), tokens_per_second,
             1000 * seconds / static_cast<double>(steps), model_flops / (peak * ranks),
             static_cast<double>(usage.ru_maxrss) / 1024.0);
  fmt::print("gemm_dtype {}\n", dtype_name(gemms));
  if (bf16_peak > 0) fmt::print("mfu_bf16_peak {:.4f}\n", model_flops / (bf16_peak * ranks));
  return 0;
}
