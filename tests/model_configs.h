// GPT configs for tests, written in one line.
#pragma once

#include "model/gpt_config.h"

namespace paraflow::testing {

inline model::GptConfig gpt_config(int64_t vocab_size, int64_t n_positions, int64_t n_embd, int64_t n_layer,
                                   int64_t n_head) {
  model::GptConfig config;
  config.vocab_size = vocab_size;
  config.n_positions = n_positions;
  config.n_embd = n_embd;
  config.n_layer = n_layer;
  config.n_head = n_head;
  return config;
}

}  // namespace paraflow::testing
