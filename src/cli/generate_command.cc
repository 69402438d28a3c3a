#include <fmt/format.h>

#include <chrono>
#include <future>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "base/error.h"
#include "cli/commands.h"
#include "infer/engine.h"
#include "infer/model_source.h"
#include "serve/text_assembler.h"

namespace paraflow::cli {

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  int64_t max_tokens = 64;
  infer::SamplingConfig sampling;
  std::vector<std::string> stops;
  std::string dtype = "auto";  // weights: float32, bfloat16, float16, q8_0, q4_k, or auto (cli::weights_dtype)
  std::string kv_cache_dtype = "auto";  // float32, bfloat16, or auto (as the weights)
};

// Prints a completion as the engine streams it, through the server's text assembly: a stop string
// ends it wherever it appears (across and inside tokens; the stop and what follows unprinted),
// text that could still become one is held back, and the end-of-text token ends it unprinted.
class PrintingSink : public infer::RequestSink {
 public:
  PrintingSink(const infer::TextCodec& codec, std::vector<std::string> stops)
      : codec_(codec), text_(std::move(stops)), start_(Clock::now()) {}

  bool on_token(const infer::TokenEvent& event) override {
    if (first_token_ == Clock::time_point()) first_token_ = Clock::now();
    ++generated_;
    if (codec_.is_end_of_text(event.token)) return false;
    print(text_.add(codec_.decode(event.token)));
    return !text_.stopped();
  }

  void on_finish(const infer::Outcome& outcome) override {
    if (!text_.stopped()) print(text_.finish());
    std::fputs("\n", stdout);
    done_.set_value(outcome);
  }

  infer::Outcome wait() { return finished_.get(); }
  double seconds_to_first_token() const { return std::chrono::duration<double>(first_token_ - start_).count(); }
  double seconds_since_first_token() const {
    return std::chrono::duration<double>(Clock::now() - first_token_).count();
  }
  int64_t generated() const { return generated_; }

 private:
  using Clock = std::chrono::steady_clock;
  static void print(const std::string& piece) {
    if (piece.empty()) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }

  const infer::TextCodec& codec_;
  serve::TextAssembler text_;
  int64_t generated_ = 0;
  Clock::time_point start_, first_token_;
  std::promise<infer::Outcome> done_;
  std::future<infer::Outcome> finished_ = done_.get_future();
};

// The serving engine with room for one sequence of the model's whole context.
infer::EngineOptions one_sequence(const model::GptConfig& config, DType weights, DType kv_cache) {
  const double bytes = 2.0 * static_cast<double>(config.n_layer * config.kv_width()) *
                       static_cast<double>(dtype_size(kv_cache)) * static_cast<double>(config.n_positions + 16);
  return infer::EngineOptions{.kv_cache_gb = bytes / (1024.0 * 1024 * 1024),
                              .max_num_seqs = 1,
                              .max_batched_tokens = std::min<int64_t>(config.n_positions, 512),
                              .weights = weights,
                              .kv_cache_dtype = kv_cache};
}

void run_generate(const GenerateOptions& options) {
  Backend& backend = cpu_backend();
  const DType weights = weights_dtype(options.dtype, backend);
  infer::ModelSource source = infer::load_model_source(options.model_dir, backend);
  const model::LoadedModel& model = source.model;
  const infer::TextCodec& codec = source.codec;
  const DType kv_cache = kv_cache_dtype(options.kv_cache_dtype, weights);
  infer::Engine engine(model.config, model.parameters, backend, one_sequence(model.config, weights, kv_cache));

  std::vector<int32_t> prompt = codec.encode(options.prompt);
  const auto room = model.config.n_positions - static_cast<int64_t>(prompt.size());
  check(room >= 1, "--prompt: its {} tokens leave no room in the model's context of {}", prompt.size(),
        model.config.n_positions);
  const int64_t max_tokens = std::min(options.max_tokens, room);
  std::fputs(options.prompt.c_str(), stdout);
  auto sink = std::make_shared<PrintingSink>(codec, options.stops);
  engine.submit(infer::Request{.prompt = prompt, .max_tokens = max_tokens, .sampling = options.sampling}, sink);
  const infer::Outcome outcome = sink->wait();
  check(outcome.error.empty(), "generation failed: {}", outcome.error);

  const int64_t generated = sink->generated();
  if (max_tokens < options.max_tokens && generated == max_tokens) {
    fmt::print(stderr, "[stopped after {} of {} tokens: the model's context of {} positions is full]\n", generated,
               options.max_tokens, model.config.n_positions);
  }
  const double seconds = sink->seconds_to_first_token() + sink->seconds_since_first_token();
  fmt::print(stderr, "[{} prompt + {} generated tokens in {:.2f}s: {:.1f} tokens/s; finish_reason: {}]\n", prompt.size(),
             generated, seconds, static_cast<double>(generated) / seconds, infer::finish_reason_name(outcome.reason));
  // The decode rate apart from the prompt's pass: what llama-bench's tg figure measures.
  if (generated > 1) {
    fmt::print(stderr, "[{} weights, {} KV cache; prefill + first token {:.1f} ms; decode {:.1f} tokens/s]\n",
               dtype_word(weights), dtype_word(kv_cache), 1000 * sink->seconds_to_first_token(),
               static_cast<double>(generated - 1) / sink->seconds_since_first_token());
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "Continue a prompt with a trained model (KV-cache decoding)");
  command->add_option("--model", options->model_dir, "Model dir (Hugging Face GPT-2 layout), or a GGUF file (GPT-2, Llama, Mistral, Qwen2)")->required()->check(CLI::ExistingPath);
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
  command->add_option("--frequency-penalty", options->sampling.frequency_penalty,
                      "Lower each token's logit by this much per time it was generated already (OpenAI's frequency_penalty)")
      ->capture_default_str()
      ->check(in_range(between(-2, 2)));
  command->add_option("--presence-penalty", options->sampling.presence_penalty,
                      "Lower the logit of every token generated already by this much (OpenAI's presence_penalty)")
      ->capture_default_str()
      ->check(in_range(between(-2, 2)));
  command->add_option("--seed", options->sampling.seed, "Sampling seed")->capture_default_str()->check(unsigned_64());
  command->add_option("--stop", options->stops,
                      "End the completion before this text, wherever it appears (repeatable; bash: --stop $'\\n\\n' "
                      "for two newlines)")
      ->check(CLI::Validator([](std::string& stop) { return stop.empty() ? std::string("must not be empty") : ""; },
                             "NONEMPTY"));
  add_weights_dtype_option(command, options->dtype);
  command->add_option("--kv-cache-dtype", options->kv_cache_dtype, "Keys and values in float32 or bfloat16; auto: as --dtype (bfloat16 for float16, q8_0 and q4_k)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16"}));
  command->callback([options] { run_generate(*options); });
}

}  // namespace paraflow::cli
