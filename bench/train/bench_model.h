// What the training benchmarks share: a GPT config from their flags and random tokens to train on.
#pragma once

#include "base/random.h"
#include "model/gpt_config.h"
#include "train/token_source.h"

namespace paraflow::bench {

inline model::GptConfig gpt_config(int64_t layers, int64_t embd, int64_t heads, int64_t context, int64_t vocab) {
  model::GptConfig config;
  config.vocab_size = vocab;
  config.n_positions = context;
  config.n_embd = embd;
  config.n_layer = layers;
  config.n_head = heads;
  return config;
}

// 2^20 uniformly random tokens (1% held out for validation): throughput does not depend on text.
inline train::TokenSource random_tokens(int64_t vocab) {
  Rng rng(1);
  std::vector<int32_t> tokens(1 << 20);
  for (auto& token : tokens) token = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return train::TokenSource::from_tokens(std::move(tokens), 0.01);
}

}  // namespace paraflow::bench
