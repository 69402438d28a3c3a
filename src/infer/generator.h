// Autoregressive generation with a KV cache: the prompt runs once through a prefill graph, then
// each new token through a one-position decode graph; both extend the same per-layer caches.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/executor.h"
#include "infer/sampler.h"
#include "model/gpt_graph.h"

namespace paraflow::infer {

// Why a generation ended, as OpenAI's API reports it: `stop` when the caller stopped it (a stop
// string, end-of-text), `length` when it produced max_new_tokens or reached the model's context.
enum class FinishReason { stop, length };
const char* finish_reason_name(FinishReason reason);  // "stop" | "length"

struct Generation {
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::length;
  bool context_full = false;  // ended because the model's context (n_positions) is full
  double prefill_seconds = 0;  // the prompt's forward pass and the first token
  double decode_seconds = 0;   // every later token
};

class Generator {
 public:
  // `weights` f32, bf16 where the backend multiplies bf16, f16, q8_0 or q4_k (model::use_weights_for_decoding).
  // Either way a copy of the weights decoding reads in another type or layout is made once, with
  // the linear layers' weights [out, in]: in bf16 (activations are then stored in bf16 too; the
  // logits and KV cache stay f32), in f16 (the matmuls' weights only), or in f32 (model::decoding_copy).
  Generator(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend,
            DType weights = DType::f32);

  // Forgets the cache and runs `tokens` from position 0; returns the logits of the last one.
  // The returned vector is the generator's own buffer, overwritten by the next call.
  const std::vector<float>& prefill(const std::vector<int32_t>& tokens);
  // Appends one token at the current position; returns its logits (the same buffer).
  const std::vector<float>& decode(int32_t token);
  // Forgets the cache and runs `tokens` (at least two) from position 0; returns the natural log of
  // the probability the model gave each token after the first, from the logits before it.
  std::vector<double> log_likelihoods(const std::vector<int32_t>& tokens);

  // Per-op wall time of the prefill and decode graphs (graph::Executor's profiling), for benchmarks.
  void set_profiling(bool enabled);
  std::map<std::string, double> profile() const;

  // Greedy or sampled continuation. `on_token` sees each new token and may return false to stop.
  Generation generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, Sampler& sampler,
                                const std::function<bool(int32_t)>& on_token = {});

 private:
  struct Step {
    model::GptGraph graph;
    std::unique_ptr<graph::Executor> executor;
  };
  Step& step_for(int64_t new_tokens);
  const std::vector<float>& run(Step& step, const int32_t* tokens, int64_t count);

  const model::GptConfig& config_;
  const model::ParameterSet& parameters_;
  Backend& backend_;
  DType weights_;
  // What decoding reads beside parameters_ (model::decoding_copy), made with the first graph.
  std::optional<model::ParameterSet> decoding_parameters_;
  std::vector<float> logits_;
  bool profiling_ = false;
  std::vector<std::pair<Tensor, Tensor>> caches_;
  std::map<int64_t, Step> steps_;  // by number of new positions
  int64_t position_ = 0;
};

// A text's perplexity: exp of the mean negative log-likelihood of its tokens, run in consecutive
// windows of `context` tokens (each from position 0; the last window may be shorter), every token
// but a window's first scored. With `second_half`, as llama.cpp's llama-perplexity scores: whole
// windows only, their first context/2 tokens context only (each scored token sees half a window
// at least), the next context - 1 - context/2 scored.
struct Perplexity {
  double perplexity = 0, mean_nll = 0;
  int64_t scored = 0, windows = 0;
};
Perplexity perplexity(Generator& generator, const std::vector<int32_t>& tokens, int64_t context,
                      bool second_half = false);

}  // namespace paraflow::infer
