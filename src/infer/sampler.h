// Next-token sampling from logits: greedy (temperature 0), temperature, top-k and nucleus (top-p),
// with a seeded generator so a given seed reproduces a completion. Before choosing, OpenAI's
// penalties and biases adjust the logits: logit[j] - count[j] x frequency_penalty -
// (count[j] > 0) x presence_penalty + logit_bias[j], count[j] being how often this sampler has
// chosen token j (the generated tokens, not the prompt's: OpenAI's and vLLM's reading).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/random.h"

namespace paraflow::infer {

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = all
  double top_p = 1.0;        // 1 = all
  uint64_t seed = 0;
  double frequency_penalty = 0;  // in [-2, 2]
  double presence_penalty = 0;   // in [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias in [-100, 100])
};

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& config);
  int32_t sample(const float* logits, int64_t vocab_size);

 private:
  // The logits the choice is made from: `logits` itself, or adjusted_ holding them adjusted.
  const float* adjust(const float* logits, int64_t vocab_size);
  int32_t choose(const float* logits, int64_t vocab_size);

  SamplingConfig config_;
  Rng rng_;
  bool adjusts_ = false;  // any penalty or bias
  std::unordered_map<int32_t, int32_t> chosen_;  // token -> times chosen (only when penalised)
  std::vector<float> adjusted_;
  // Candidates and their weights, kept between calls so sampling a token allocates nothing.
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace paraflow::infer
