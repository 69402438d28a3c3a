// A small GPT-2 trained for a few steps on a repetitive token stream, so its predictions have
// clear winners (ties between top logits are rare) — for generation and interop tests.
#pragma once

#include <filesystem>

#include "model_configs.h"
#include "train/trainer.h"

namespace paraflow::testing {

inline model::GptConfig small_config() { return gpt_config(67, 48, 36, 2, 3); }
// Its Llama-family twin: grouped k/v heads (6 q, 2 k/v of head_dim 6), an untied head.
inline model::GptConfig small_llama_config() { return llama_config("llama", 67, 48, 36, 56, 2, 6, 2, 6); }

// A stream where token t+1 is mostly a function of token t: easy to learn in a few steps.
inline train::TokenSource repetitive_tokens(int64_t vocab_size) {
  std::vector<int32_t> tokens;
  Rng rng(5);
  for (int i = 0; i < 20000; ++i) {
    int32_t previous = tokens.empty() ? 0 : tokens.back();
    tokens.push_back(rng.uniform() < 0.9 ? static_cast<int32_t>((previous * 7 + 3) % vocab_size)
                                         : static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size))));
  }
  return train::TokenSource::from_tokens(std::move(tokens), 0.1);
}

inline train::TrainConfig short_training(const std::filesystem::path& out_dir, int64_t steps) {
  train::TrainConfig config;
  config.batch_size = 4;
  config.sequence_length = 32;
  config.steps = steps;
  config.schedule = {3e-3, 3e-4, 5, steps};
  config.out_dir = out_dir;
  config.seed = 11;
  return config;
}

}  // namespace paraflow::testing
