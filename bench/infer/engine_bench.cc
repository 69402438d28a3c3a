// The serving engine's own throughput, without HTTP or a client competing for the cores: a fixed,
// seeded set of requests (random prompt tokens of lengths drawn from a range, greedy, a fixed
// number of tokens each), run to the end by continuous batching. All are submitted at once, or
// with --in-flight N as a closed loop (N at a time, the next submitted as one finishes, as the
// serving benchmark's clients do). Prints the generated tokens per second, the steps and their
// mean time, and the inter-token latency; with --profile, where a measured step's time goes (per
// op kind and per timed part of the engine's host work, in ms per step; the engine publishes its
// profile after each step, so the last step may not be in it yet).
//
//     build/bench/infer/engine_bench --model DIR|FILE.gguf [--dtype float32|bfloat16|float16|q8_0|q4_k] [--requests 32]
//         [--in-flight N] [--prompt-tokens 32:128] [--tokens 64] [--max-num-seqs 32] [--kv-cache-dtype auto]
//         [--max-batched-tokens N] [--max-decoding-step-tokens N]
//         [--profile]
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>

#include "backend/cpu/gemm.h"
#include "cli/commands.h"
#include "infer/engine.h"
#include "machine.h"
#include "model/model_files.h"

using namespace paraflow;
using Clock = std::chrono::steady_clock;

namespace {

// Every request's token times, and a count of those finished.
class Finishing {
 public:
  class Sink : public infer::RequestSink {
   public:
    explicit Sink(Finishing& owner) : owner_(owner) {}
    bool on_token(const infer::TokenEvent&) override {
      times.push_back(Clock::now());
      return true;
    }
    void on_finish(const infer::Outcome& outcome) override { owner_.finish(outcome); }
    Clock::time_point submitted;
    std::vector<Clock::time_point> times;

   private:
    Finishing& owner_;
  };
  void finish(const infer::Outcome& outcome) {
    std::lock_guard lock(mutex_);
    if (!outcome.error.empty()) errors_.push_back(outcome.error);
    ++finished_;
    changed_.notify_all();
  }
  void wait_for(int64_t count) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return finished_ >= count; });
    if (!errors_.empty()) throw Error("engine_bench: a request failed: " + errors_.front());
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t finished_ = 0;
  std::vector<std::string> errors_;
};

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(p * static_cast<double>(values.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"paraflow serving engine benchmark"};
  std::string model_dir, dtype = "float32", kv_cache_dtype = "auto", prompt_range = "32:128";
  int64_t requests = 32, in_flight = 0, tokens = 64, max_num_seqs = 32, max_batched_tokens = 0,
          max_decoding_step_tokens = 0, seed = 1;
  bool profile = false;
  app.add_option("--model", model_dir, "Model dir (Hugging Face GPT-2 layout)")->required();
  app.add_option("--dtype", dtype)->check(CLI::IsMember({"float32", "bfloat16", "float16", "q8_0", "q4_k"}));
  app.add_option("--kv-cache-dtype", kv_cache_dtype)->check(CLI::IsMember({"auto", "float32", "bfloat16"}));
  app.add_option("--requests", requests, "Requests");
  app.add_option("--in-flight", in_flight, "Requests in flight at once (closed loop); 0: all submitted at once");
  app.add_option("--prompt-tokens", prompt_range, "Prompt lengths MIN:MAX, uniform");
  app.add_option("--tokens", tokens, "Tokens generated per request");
  app.add_option("--max-num-seqs", max_num_seqs, "Sequences running at once");
  app.add_option("--max-batched-tokens", max_batched_tokens, "Tokens per step (0: the engine's default)");
  app.add_option("--max-decoding-step-tokens", max_decoding_step_tokens,
                 "Tokens per step while a request streams (0: the engine's default)");
  app.add_option("--seed", seed, "Prompt seed");
  app.add_flag("--profile", profile, "Time each op kind and the engine's host work (steps run a little slower)");
  CLI11_PARSE(app, argc, argv);
  int64_t prompt_min = 0, prompt_max = 0;
  if (std::sscanf(prompt_range.c_str(), "%ld:%ld", &prompt_min, &prompt_max) != 2 || prompt_min < 1 ||
      prompt_max < prompt_min) {
    fmt::print(stderr, "engine_bench: --prompt-tokens must be MIN:MAX with 1 <= MIN <= MAX, got '{}'\n", prompt_range);
    return 2;
  }

  Backend& backend = cpu_backend();
  model::LoadedModel model = model::load_model_dir(model_dir, backend);
  infer::EngineOptions options;
  options.weights = cli::weights_dtype(dtype, backend);
  options.kv_cache_dtype = cli::kv_cache_dtype(kv_cache_dtype, options.weights);
  options.kv_cache_gb = 1.0;
  options.max_num_seqs = max_num_seqs;
  options.max_batched_tokens = max_batched_tokens;
  options.max_decoding_step_tokens = max_decoding_step_tokens;
  options.profile = profile;
  options.max_waiting = std::max<int64_t>(options.max_waiting, requests);  // all may wait at once
  infer::Engine engine(model.config, model.parameters, backend, options);

  // The measured prompts come from `seed` alone; the warm-up's from a generator of their own.
  std::mt19937_64 rng(static_cast<uint64_t>(seed)), warm_rng(static_cast<uint64_t>(seed) + 1);
  std::uniform_int_distribution<int64_t> length(prompt_min, prompt_max);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(model.config.vocab_size - 1));
  auto make_request = [&](std::mt19937_64& source) {
    infer::Request request;
    request.prompt.resize(static_cast<size_t>(length(source)));
    for (int32_t& id : request.prompt) id = token(source);
    request.max_tokens = tokens;
    request.sampling.temperature = 0;  // greedy, as the load generator asks
    return request;
  };
  {  // warm-up: graphs built, memory planned for a full batch
    Finishing warm;
    for (int64_t r = 0; r < std::min<int64_t>(requests, max_num_seqs); ++r) {
      infer::Request request = make_request(warm_rng);
      request.max_tokens = 2;
      engine.submit(request, std::make_shared<Finishing::Sink>(warm));
    }
    warm.wait_for(std::min<int64_t>(requests, max_num_seqs));
  }
  const infer::EngineStats before = engine.stats();
  const std::map<std::string, double> profile_before = engine.profile();
  Finishing finishing;
  std::vector<std::shared_ptr<Finishing::Sink>> sinks;
  int64_t prompt_tokens = 0;
  const auto start = Clock::now();
  for (int64_t r = 0; r < requests; ++r) {
    if (in_flight > 0 && r >= in_flight) finishing.wait_for(r - in_flight + 1);
    infer::Request request = make_request(rng);
    prompt_tokens += static_cast<int64_t>(request.prompt.size());
    sinks.push_back(std::make_shared<Finishing::Sink>(finishing));
    sinks.back()->submitted = Clock::now();
    engine.submit(std::move(request), sinks.back());
  }
  finishing.wait_for(requests);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const infer::EngineStats after = engine.stats();
  std::vector<double> gaps_ms, first_token_ms;
  int64_t generated = 0;
  for (const auto& sink : sinks) {
    generated += static_cast<int64_t>(sink->times.size());
    if (!sink->times.empty()) {
      first_token_ms.push_back(std::chrono::duration<double, std::milli>(sink->times[0] - sink->submitted).count());
    }
    for (size_t t = 1; t < sink->times.size(); ++t) {
      gaps_ms.push_back(std::chrono::duration<double, std::milli>(sink->times[t] - sink->times[t - 1]).count());
    }
  }
  const int64_t steps = after.steps - before.steps;
  fmt::print("cpu {}\nonednn_isa {}\nthreads {}\ndtype {}\nkv_cache_dtype {}\nmax_batched_tokens {}\n"
             "max_decoding_step_tokens {}\nrequests {}\nprompt_tokens {}\ngenerated_tokens {}\n",
             bench::cpu_model(), cpu::onednn_isa_name(), omp_get_max_threads(), dtype, dtype_name(options.kv_cache_dtype),
             engine.options().max_batched_tokens, engine.options().max_decoding_step_tokens, requests, prompt_tokens,
             generated);
  const double step_ms = 1000 * seconds / static_cast<double>(std::max<int64_t>(steps, 1));
  fmt::print("seconds {:.3f}\ngenerated_tokens_per_s {:.1f}\nsteps {}\nstep_ms_mean {:.2f}\n", seconds,
             static_cast<double>(generated) / seconds, steps, step_ms);
  fmt::print("ttft_ms_p50 {:.2f}\nttft_ms_p99 {:.2f}\n", percentile(first_token_ms, 0.5),
             percentile(first_token_ms, 0.99));
  fmt::print("itl_ms_p50 {:.2f}\nitl_ms_p99 {:.2f}\n", percentile(gaps_ms, 0.5), percentile(gaps_ms, 0.99));
  if (profile) {
    std::map<std::string, double> times = engine.profile();
    for (const auto& [part, part_seconds] : profile_before) times[part] -= part_seconds;
    double total = 0;
    for (const auto& [part, part_seconds] : times) total += part_seconds;
    for (const auto& [part, part_seconds] : times) {
      fmt::print("profile {:<34} {:7.3f} ms/step {:5.1f}%\n", part, 1000 * part_seconds / static_cast<double>(steps),
                 100 * part_seconds / total);
    }
  }
  return 0;
} catch (const std::exception& error) {  // a bad model directory, say: a message, not an abort
  fmt::print(stderr, "engine_bench: {}\n", error.what());
  return 1;
}
