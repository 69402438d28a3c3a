// Autoregressive generation with a KV cache: the prompt runs once through a prefill graph, then
// each new token through a one-position decode graph; both extend the same per-layer caches.
#pragma once

#include <functional>
#include <map>
#include <memory>
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
};

class Generator {
 public:
  Generator(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend);

  // Forgets the cache and runs `tokens` from position 0; returns the logits of the last one.
  std::vector<float> prefill(const std::vector<int32_t>& tokens);
  // Appends one token at the current position; returns its logits.
  std::vector<float> decode(int32_t token);

  // Greedy or sampled continuation. `on_token` sees each new token and may return false to stop.
  Generation generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, Sampler& sampler,
                                const std::function<bool(int32_t)>& on_token = {});

 private:
  struct Step {
    model::GptGraph graph;
    std::unique_ptr<graph::Executor> executor;
  };
  Step& step_for(int64_t new_tokens);
  std::vector<float> run(Step& step, const int32_t* tokens, int64_t count);

  const model::GptConfig& config_;
  const model::ParameterSet& parameters_;
  Backend& backend_;
  std::vector<std::pair<Tensor, Tensor>> caches_;
  std::map<int64_t, Step> steps_;  // by number of new positions
  int64_t position_ = 0;
};

}  // namespace paraflow::infer
