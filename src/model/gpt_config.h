// GPT-2 architecture hyper-parameters, read from our YAML `model:` section or a Hugging Face
// config.json, and written back as one.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/config.h"

namespace paraflow::model {

struct GptConfig {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double layer_norm_epsilon = 1e-5;
  // Hugging Face GPT2Config's attention scaling: scores are q·k^T times attention_scale(layer).
  bool scale_attn_weights = true;                // by 1/sqrt(head size)
  bool scale_attn_by_inverse_layer_idx = false;  // by 1/(layer + 1), layers counted from 0

  static GptConfig from_config(const Config& config);  // keys model.*
  static GptConfig from_hf_json(const nlohmann::json& json, const std::string& origin);
  // bos_token_id and eos_token_id (what Hugging Face's generate() stops at) are the tokenizer's
  // end-of-text id, or null without one (-1).
  nlohmann::json to_hf_json(int64_t end_of_text = -1) const;
  void validate(const std::string& origin) const;

  double attention_scale(int64_t layer) const;

  int64_t parameter_count() const;
  // Training FLOPs per token: 6N for the matmuls plus 6·n_layer·n_embd·T for attention (PaLM's count).
  double flops_per_token(int64_t sequence_length) const;
};

}  // namespace paraflow::model
