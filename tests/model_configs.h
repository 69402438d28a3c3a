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

// A Llama-family config (model_type llama, mistral or qwen2): q heads, k/v heads and head_dim
// explicit, rope_theta 10000 and no scaling unless changed.
inline model::GptConfig llama_config(const char* model_type, int64_t vocab_size, int64_t n_positions, int64_t n_embd,
                                     int64_t intermediate_size, int64_t n_layer, int64_t n_head, int64_t n_kv_head,
                                     int64_t head_dim) {
  model::GptConfig config = gpt_config(vocab_size, n_positions, n_embd, n_layer, n_head);
  config.architecture = model::Architecture::llama;
  config.model_type = model_type;
  config.intermediate_size = intermediate_size;
  config.n_kv_head = n_kv_head;
  config.head_dim = head_dim;
  config.layer_norm_epsilon = 1e-6;
  config.tie_word_embeddings = false;
  config.qkv_bias = config.model_type == "qwen2";
  return config;
}

}  // namespace paraflow::testing
