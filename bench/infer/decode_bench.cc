// Batch-1 decoding speed of paraflow's generator on a model dir, at float32 or bfloat16 weights:
// the decode rate after the prompt's pass (what llama-bench's tg figure measures), and with
// --profile the time of each op kind over the decoded tokens.
//
//     build/bench/infer/decode_bench --model DIR|FILE.gguf [--tokens 128] [--dtype float32|bfloat16|float16|q8_0|q4_k] [--profile]
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>

#include "backend/cpu/gemm.h"
#include "cli/commands.h"
#include "machine.h"
#include "infer/generator.h"
#include "model/model_files.h"

using namespace paraflow;

int main(int argc, char** argv) try {
  CLI::App app{"paraflow decode benchmark"};
  std::string model_dir, dtype = "float32";
  int64_t tokens = 128;
  bool profile = false;
  app.add_option("--model", model_dir, "Model dir (Hugging Face GPT-2 layout)")->required();
  app.add_option("--tokens", tokens, "Tokens to decode after a one-token prompt");
  app.add_option("--dtype", dtype)->check(CLI::IsMember({"float32", "bfloat16", "float16", "q8_0", "q4_k"}));
  app.add_flag("--profile", profile, "Print the time of each op kind");
  CLI11_PARSE(app, argc, argv);

  Backend& backend = cpu_backend();
  model::LoadedModel model = model::load_model_dir(model_dir, backend);
  infer::Generator generator(model.config, model.parameters, backend, cli::weights_dtype(dtype, backend));
  generator.set_profiling(profile);
  infer::Sampler greedy({0.0, 0, 1.0, 0});
  generator.generate({0}, 4, greedy);  // warm-up: graphs built, memory planned, GEMM primitives compiled
  const infer::Generation run = generator.generate({0}, tokens, greedy);
  const double decoded = static_cast<double>(run.tokens.size() - 1);
  fmt::print("cpu {}\nonednn_isa {}\nthreads {}\ndtype {}\nparameters {}\ndecode_tokens_per_s {:.2f}\n", bench::cpu_model(), cpu::onednn_isa_name(),
             omp_get_max_threads(), dtype, model.config.parameter_count(), decoded / run.decode_seconds);
  if (!profile) return 0;
  double total = 0;
  for (const auto& [key, seconds] : generator.profile()) total += seconds;
  for (const auto& [key, seconds] : generator.profile()) {
    fmt::print("profile {:<26} {:8.3f} ms/token {:5.1f}%\n", key, 1000 * seconds / (decoded + 4), 100 * seconds / total);
  }
  return 0;
} catch (const std::exception& error) {  // a bad model directory, say: a message, not an abort
  fmt::print(stderr, "decode_bench: {}\n", error.what());
  return 1;
}
