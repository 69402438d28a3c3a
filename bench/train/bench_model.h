// What the training benchmarks share: a GPT or Llama config from their flags and random tokens to
// train on.
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

// The Llama family's shape on the same flags: `kv_heads` k/v heads, a SwiGLU MLP of
// `intermediate` columns, an untied head (as Llama's), rotary positions instead of wpe.
inline model::GptConfig llama_config(int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads,
                                     int64_t intermediate, int64_t context, int64_t vocab) {
  model::GptConfig config = gpt_config(layers, embd, heads, context, vocab);
  config.architecture = model::Architecture::llama;
  config.model_type = "llama";
  config.n_kv_head = kv_heads;
  config.intermediate_size = intermediate;
  config.layer_norm_epsilon = 1e-6;
  config.tie_word_embeddings = false;
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
