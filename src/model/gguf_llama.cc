#include "model/gguf_llama.h"

#include <cmath>
#include <numbers>

#include "base/error.h"
#include "model/gguf_model.h"
#include "model/gguf_tensors.h"

namespace paraflow::model {
namespace {

class Hyperparameters {
 public:
  Hyperparameters(const GgufFile& file, std::string architecture) : file_(file), prefix_(std::move(architecture) + ".") {}

  bool has(const std::string& key) const { return file_.contains(prefix_ + key); }
  std::string name(const std::string& key) const { return prefix_ + key; }
  int64_t positive(const std::string& key) const { return gguf_positive(file_, name(key)); }
  int64_t positive_or(const std::string& key, int64_t otherwise) const { return has(key) ? positive(key) : otherwise; }
  double number(const std::string& key) const { return file_.value(name(key)).as_float(file_.path() + ": " + name(key)); }
  std::string text(const std::string& key) const { return file_.value(name(key)).as_string(file_.path() + ": " + name(key)); }

 private:
  const GgufFile& file_;
  std::string prefix_;
};

// Each frequency's divisor under `rope` (what the converter's generate_extra_tensors computes):
// the plain inverse frequency over the scaled one.
std::vector<float> rope_divisors(const RopeFrequencies& rope, int64_t head_size) {
  RopeFrequencies plain = rope;
  plain.scaling = RopeScaling::none;
  const std::vector<float> unscaled = rope_inverse_frequencies(plain, head_size), scaled = rope_inverse_frequencies(rope, head_size);
  std::vector<float> divisors(unscaled.size());
  for (size_t i = 0; i < divisors.size(); ++i) divisors[i] = unscaled[i] / scaled[i];
  return divisors;
}

// llama3 scaling from rope_freqs.weight's divisors d_i: the largest is `factor`; between 1 and
// factor, 1/d = (1 - s)/factor + s with s = (L / wavelength - low) / (high - low), a line in
// 1/wavelength whose slope and intercept fix L/(high - low) and low/(high - low): taking low = 1
// (as every Llama 3 does) gives all four. Needs two divisors strictly between 1 and factor.
RopeFrequencies llama3_from_divisors(const GgufFile& file, RopeFrequencies rope, int64_t head_size) {
  const std::string where = file.path() + ": rope_freqs.weight";
  const Tensor tensor = file.tensor("rope_freqs.weight");
  check(tensor.shape() == Shape{head_size / 2}, "{} is {}, expected [{}] (head_size / 2)", where, tensor.shape().to_string(),
        head_size / 2);
  const std::vector<float> divisors = gguf_values(tensor);
  double factor = 1;
  for (float d : divisors) factor = std::max(factor, static_cast<double>(d));
  std::vector<std::pair<double, double>> line;  // (1 / wavelength, s)
  for (int64_t i = 0; i < head_size / 2; ++i) {
    const double d = divisors[static_cast<size_t>(i)];
    check(d >= 1 - 1e-6, "{}: divisor {} is {}; llama3 scaling divides by 1 to factor", where, i, d);
    if (d <= 1 + 1e-6 || d >= factor * (1 - 1e-6)) continue;
    const double frequency = 1.0 / std::pow(rope.theta, 2.0 * static_cast<double>(i) / static_cast<double>(head_size));
    line.emplace_back(frequency / (2 * std::numbers::pi), (1 / d - 1 / factor) / (1 - 1 / factor));
  }
  check(line.size() >= 2,
        "{}: {} of its divisors lie strictly between 1 and the factor {}; llama3 scaling's parameters need two", where,
        line.size(), factor);
  const auto [x0, s0] = line.front();
  const auto [x1, s1] = line.back();
  const double slope = (s1 - s0) / (x1 - x0), intercept = s0 - slope * x0;  // s = slope / wavelength + intercept
  check(intercept < 0, "{}: not llama3 scaling (its smooth part does not fit low_freq_factor > 0)", where);
  const double width = -1 / intercept;  // high - low, with low = 1
  rope.scaling = RopeScaling::llama3;
  rope.factor = factor;
  rope.low_freq_factor = 1;
  rope.high_freq_factor = 1 + width;
  rope.original_max_position = std::round(slope * width);
  const std::vector<float> recovered = rope_divisors(rope, head_size);
  for (size_t i = 0; i < divisors.size(); ++i) {
    check(std::abs(recovered[i] - divisors[i]) <= 1e-5f * divisors[i],
          "{}: divisor {} is {}, but llama3 scaling (factor {}, low_freq_factor 1, high_freq_factor {}, "
          "original_max_position_embeddings {}) gives {}",
          where, i, divisors[i], rope.factor, rope.high_freq_factor, rope.original_max_position, recovered[i]);
  }
  return rope;
}

}  // namespace

GptConfig llama_config_from_gguf(const GgufFile& file, const std::string& architecture) {
  const std::string& where = file.path();
  const Hyperparameters h(file, architecture);
  GptConfig config;
  config.architecture = Architecture::llama;
  config.model_type = architecture == "qwen2" ? "qwen2" : "llama";
  config.n_positions = h.positive("context_length");
  config.n_embd = h.positive("embedding_length");
  config.n_layer = h.positive("block_count");
  config.intermediate_size = h.positive("feed_forward_length");
  config.n_head = h.positive("attention.head_count");
  config.n_kv_head = h.positive_or("attention.head_count_kv", config.n_head);
  check(config.n_head % config.n_kv_head == 0, "{}: {} {} is not a multiple of {} {}", where,
        h.name("attention.head_count"), config.n_head, h.name("attention.head_count_kv"), config.n_kv_head);
  if (!h.has("attention.key_length")) {
    check(config.n_embd % config.n_head == 0, "{}: {} {} is not a multiple of {} {} (and there is no {})", where,
          h.name("embedding_length"), config.n_embd, h.name("attention.head_count"), config.n_head,
          h.name("attention.key_length"));
  }
  config.head_dim = h.positive_or("attention.key_length", config.n_embd / config.n_head);
  const int64_t value_length = h.positive_or("attention.value_length", config.head_dim);
  check(value_length == config.head_dim, "{}: {} {} differs from {} {}; only equal ones are implemented", where,
        h.name("attention.value_length"), value_length, h.name("attention.key_length"), config.head_dim);
  const int64_t rotary = h.positive_or("rope.dimension_count", config.head_dim);
  check(rotary == config.head_dim, "{}: {} {} rotates part of a head of {}; partial rotary is not implemented", where,
        h.name("rope.dimension_count"), rotary, config.head_dim);
  config.layer_norm_epsilon = h.number("attention.layer_norm_rms_epsilon");
  if (h.has("rope.freq_base")) config.rope.theta = h.number("rope.freq_base");
  if (h.has("expert_count")) {
    check(h.positive("expert_count") <= 1, "{}: {} {}: mixtures of experts are not implemented", where,
          h.name("expert_count"), h.positive("expert_count"));
  }
  const std::string scaling = h.has("rope.scaling.type") ? h.text("rope.scaling.type") : "none";
  if (scaling == "linear") {
    config.rope.scaling = RopeScaling::linear;
    config.rope.factor = h.number("rope.scaling.factor");
  } else {
    check(scaling == "none", "{}: {} '{}' is not implemented (none, linear, or llama3 through rope_freqs.weight)", where,
          h.name("rope.scaling.type"), scaling);
  }
  if (file.contains_tensor("rope_freqs.weight")) {
    check(config.rope.scaling == RopeScaling::none, "{}: both {} '{}' and rope_freqs.weight", where,
          h.name("rope.scaling.type"), scaling);
    config.rope = llama3_from_divisors(file, config.rope, config.head_dim);
  }
  const GgufTensorInfo& table = file.tensor_info("token_embd.weight");
  check(table.shape.rank() == 2 && table.shape[1] == config.n_embd, "{}: token_embd.weight {} is not [vocab, {}]", where,
        table.shape.to_string(), config.n_embd);
  config.vocab_size = table.shape[0];
  config.tie_word_embeddings = !file.contains_tensor("output.weight");
  // Biases as block 0 holds them (every block alike, as the parameters' names check).
  const bool q_bias = file.contains_tensor("blk.0.attn_q.bias"), o_bias = file.contains_tensor("blk.0.attn_output.bias");
  config.qkv_bias = config.model_type == "qwen2" && q_bias;
  config.attention_bias = config.model_type == "llama" && (q_bias || o_bias);
  config.mlp_bias = file.contains_tensor("blk.0.ffn_up.bias");
  config.validate(where);
  return config;
}

std::vector<std::pair<std::string, GgufValue>> llama_gguf_metadata(const GptConfig& config) {
  const std::string arch = gguf_architecture(config);
  auto u32 = [](int64_t value) { return gguf_u32(static_cast<uint32_t>(value)); };
  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", gguf_string(arch)},
      {arch + ".context_length", u32(config.n_positions)},
      {arch + ".embedding_length", u32(config.n_embd)},
      {arch + ".block_count", u32(config.n_layer)},
      {arch + ".feed_forward_length", u32(config.intermediate_size)},
      {arch + ".attention.head_count", u32(config.n_head)},
      {arch + ".attention.head_count_kv", u32(config.kv_heads())},
      {arch + ".rope.freq_base", gguf_f32(static_cast<float>(config.rope.theta))},
      {arch + ".attention.layer_norm_rms_epsilon", gguf_f32(static_cast<float>(config.layer_norm_epsilon))},
      {arch + ".attention.key_length", u32(config.head_size())},
      {arch + ".attention.value_length", u32(config.head_size())},
  };
  if (arch == "llama") {
    metadata.emplace_back("llama.vocab_size", u32(config.vocab_size));
    metadata.emplace_back("llama.rope.dimension_count", u32(config.head_size()));
  }
  if (config.rope.scaling == RopeScaling::linear) {
    metadata.emplace_back(arch + ".rope.scaling.type", gguf_string("linear"));
    metadata.emplace_back(arch + ".rope.scaling.factor", gguf_f32(static_cast<float>(config.rope.factor)));
  }
  return metadata;
}

std::optional<Tensor> llama_rope_freqs(const GptConfig& config) {
  if (config.rope.scaling != RopeScaling::llama3) return std::nullopt;
  const std::vector<float> divisors = rope_divisors(config.rope, config.head_size());
  return to_gguf_type(divisors, Shape{static_cast<int64_t>(divisors.size())}, DType::f32);
}

}  // namespace paraflow::model
