#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "base/error.h"
#include "cli/commands.h"
#include "infer/generator.h"
#include "infer/text_codec.h"
#include "model/model_files.h"

namespace paraflow::cli {

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  int64_t max_tokens = 64;
  infer::SamplingConfig sampling;
  std::vector<std::string> stops;
  std::string dtype = "auto";  // weights: float32, bfloat16, or auto (bfloat16 where the CPU multiplies it)
};

void run_generate(const GenerateOptions& options) {
  Backend& backend = cpu_backend();
  model::LoadedModel model = model::load_model_dir(options.model_dir, backend);
  infer::TextCodec codec(options.model_dir);
  const DType weights = weights_dtype(options.dtype, backend);
  infer::Generator generator(model.config, model.parameters, backend, weights);
  infer::Sampler sampler(options.sampling);

  std::vector<int32_t> prompt = codec.encode(options.prompt);
  std::string completion;
  std::fputs(options.prompt.c_str(), stdout);
  auto start = std::chrono::steady_clock::now();
  size_t printed = 0;
  infer::Generation generation = generator.generate(prompt, options.max_tokens, sampler, [&](int32_t token) {
    if (codec.is_end_of_text(token)) return false;
    completion += codec.decode(token);
    for (const std::string& stop : options.stops) {
      if (!stop.empty() && completion.size() >= stop.size() &&
          completion.compare(completion.size() - stop.size(), stop.size(), stop) == 0) {
        completion.resize(completion.size() - stop.size());
        return false;
      }
    }
    // Hold back text that could still become a stop sequence.
    size_t hold = 0;
    for (const std::string& stop : options.stops) hold = std::max(hold, stop.size() - 1);
    if (completion.size() > printed + hold) {
      std::fwrite(completion.data() + printed, 1, completion.size() - hold - printed, stdout);
      std::fflush(stdout);
      printed = completion.size() - hold;
    }
    return true;
  });
  if (completion.size() > printed) std::fwrite(completion.data() + printed, 1, completion.size() - printed, stdout);
  std::fputs("\n", stdout);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t generated = generation.tokens.size();
  if (generation.context_full) {
    fmt::print(stderr, "[stopped after {} of {} tokens: the model's context of {} positions is full]\n", generated,
               options.max_tokens, model.config.n_positions);
  }
  fmt::print(stderr, "[{} prompt + {} generated tokens in {:.2f}s: {:.1f} tokens/s; finish_reason: {}]\n", prompt.size(),
             generated, seconds, static_cast<double>(generated) / seconds,
             infer::finish_reason_name(generation.finish_reason));
  // The decode rate apart from the prompt's pass: what llama-bench's tg figure measures.
  if (generated > 1) {
    fmt::print(stderr, "[{} weights; prefill + first token {:.1f} ms; decode {:.1f} tokens/s]\n",
               weights == DType::bf16 ? "bfloat16" : "float32", 1000 * generation.prefill_seconds,
               static_cast<double>(generated - 1) / generation.decode_seconds);
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "Continue a prompt with a trained model (KV-cache decoding)");
  command->add_option("--model", options->model_dir, "Model dir (Hugging Face GPT-2 layout)")->required()->check(CLI::ExistingDirectory);
  command->add_option("--prompt", options->prompt, "Text to continue")->required();
  command->add_option("--max-tokens", options->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(in_range(at_least(1)));
  command->add_option("--temperature", options->sampling.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--top-k", options->sampling.top_k, "Sample among the k most likely (0 = all)")
      ->capture_default_str()
      ->check(in_range(at_least(0)));
  command->add_option("--top-p", options->sampling.top_p, "Nucleus sampling mass, in (0, 1]")
      ->capture_default_str()
      ->check(in_range({.low = 0, .high = 1, .low_open = true}));
  command->add_option("--seed", options->sampling.seed, "Sampling seed")->capture_default_str();
  command->add_option("--stop", options->stops, "Stop when the completion ends with this text (repeatable)");
  command->add_option("--dtype", options->dtype,
                      "Weights in float32 or bfloat16; auto: bfloat16 where the CPU has bf16 GEMMs (AMX, AVX512_BF16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16"}));
  command->callback([options] { run_generate(*options); });
}

}  // namespace paraflow::cli
