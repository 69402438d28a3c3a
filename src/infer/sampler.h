// Next-token sampling from logits: greedy (temperature 0), temperature, top-k and nucleus (top-p),
// with a seeded generator so a given seed reproduces a completion.
#pragma once

#include <cstdint>
#include <vector>

#include "base/random.h"

namespace paraflow::infer {

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = all
  double top_p = 1.0;        // 1 = all
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& config);
  int32_t sample(const float* logits, int64_t vocab_size);

 private:
  SamplingConfig config_;
  Rng rng_;
  // Candidates and their weights, kept between calls so sampling a token allocates nothing.
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace paraflow::infer
