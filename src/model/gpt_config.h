// Model hyper-parameters, read from our YAML `model:` section or a Hugging Face config.json, and
// written back as one: GPT-2, or the Llama family (Llama 2/3, Mistral, Qwen2: pre-norm blocks of
// RMSNorm, rotary attention with grouped k/v heads, and a SwiGLU MLP).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/kernel_args.h"
#include "base/config.h"

namespace paraflow::model {

enum class Architecture : uint8_t { gpt2, llama };
const char* architecture_name(Architecture architecture);

struct GptConfig {
  Architecture architecture = Architecture::gpt2;
  // Hugging Face's model_type, written back to config.json: gpt2, or for llama: llama, mistral
  // or qwen2.
  std::string model_type = "gpt2";
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double layer_norm_epsilon = 1e-5;  // llama: RMSNorm's eps (rms_norm_eps)
  // Hugging Face GPT2Config's attention scaling: scores are q·k^T times attention_scale(layer).
  bool scale_attn_weights = true;                // by 1/sqrt(head size)
  bool scale_attn_by_inverse_layer_idx = false;  // by 1/(layer + 1), layers counted from 0
  // An lm_head of its own ([vocab, n_embd], "lm_head.weight") rather than the embedding table.
  bool tie_word_embeddings = true;

  // Llama family (n_positions is max_position_embeddings; there is no position table).
  int64_t n_kv_head = 0;          // num_key_value_heads; 0: n_head
  int64_t head_dim = 0;           // 0: n_embd / n_head
  int64_t intermediate_size = 0;  // the MLP's width (GPT-2's is 4 * n_embd)
  RopeFrequencies rope;           // rope_theta and rope_scaling
  bool attention_bias = false;    // q, k, v and o projections with biases
  bool qkv_bias = false;          // q, k and v only (Qwen2)
  bool mlp_bias = false;
  int64_t sliding_window = 0;     // Mistral/Qwen2's attention window; 0: none. Sequences must fit in it.

  bool is_llama() const { return architecture == Architecture::llama; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int64_t mlp_width() const { return is_llama() ? intermediate_size : 4 * n_embd; }
  // The fused q, k, v projection's width: (n_head + 2 * kv_heads) * head_size.
  int64_t qkv_width() const { return (n_head + 2 * kv_heads()) * head_size(); }
  // A position's keys (or values) in one layer's KV cache: kv_heads * head_size.
  int64_t kv_width() const { return kv_heads() * head_size(); }
  // What the names of block i's tensors and nodes start with, before i: "h." (GPT-2's),
  // "model.layers." (the Llama family's).
  std::string block_prefix() const { return is_llama() ? "model.layers." : "h."; }
  // Fails naming the setting when sequences of `length` positions would need what is not implemented.
  void check_sequence_length(int64_t length, const std::string& what) const;

  static GptConfig from_config(const Config& config);  // keys model.*
  static GptConfig from_hf_json(const nlohmann::json& json, const std::string& origin);
  // bos_token_id and eos_token_id (what Hugging Face's generate() stops at) are the tokenizer's
  // end-of-text id, or null without one (-1).
  nlohmann::json to_hf_json(int64_t end_of_text = -1) const;
  void validate(const std::string& origin) const;

  double attention_scale(int64_t layer) const;

  int64_t parameter_count() const;
  double parameter_estimate() const;
  // Training FLOPs per token: 6N for the matmuls plus 6·n_layer·n_embd·T for attention (PaLM's count).
  double flops_per_token(int64_t sequence_length) const;
};

}  // namespace paraflow::model
