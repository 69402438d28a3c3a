#include "model/gpt_config.h"

#include "base/error.h"

namespace paraflow::model {

GptConfig GptConfig::from_config(const Config& config) {
  GptConfig c;
  c.vocab_size = config.get<int64_t>("model.vocab_size");
  c.n_positions = config.get<int64_t>("model.n_positions");
  c.n_embd = config.get<int64_t>("model.n_embd");
  c.n_layer = config.get<int64_t>("model.n_layer");
  c.n_head = config.get<int64_t>("model.n_head");
  c.layer_norm_epsilon = config.get<double>("model.layer_norm_epsilon");
  c.validate(config.origin());
  return c;
}

GptConfig GptConfig::from_hf_json(const nlohmann::json& json, const std::string& origin) {
  check(json.is_object(), "{}: expected a JSON object", origin);
  if (json.contains("model_type")) {
    check(json["model_type"] == "gpt2", "{}: model_type is {}, only gpt2 is supported", origin,
          json["model_type"].dump());
  }
  auto integer = [&](const char* key) -> int64_t {
    check(json.contains(key), "{}: missing field '{}'", origin, key);
    check(json[key].is_number_integer(), "{}: field '{}' must be an integer, got {}", origin, key, json[key].dump());
    return json[key].get<int64_t>();
  };
  GptConfig c;
  c.vocab_size = integer("vocab_size");
  c.n_positions = integer("n_positions");
  c.n_embd = integer("n_embd");
  c.n_layer = integer("n_layer");
  c.n_head = integer("n_head");
  if (json.contains("layer_norm_epsilon")) {
    check(json["layer_norm_epsilon"].is_number(), "{}: field 'layer_norm_epsilon' must be a number", origin);
    c.layer_norm_epsilon = json["layer_norm_epsilon"].get<double>();
  }
  if (json.contains("activation_function")) {
    check(json["activation_function"] == "gelu_new" || json["activation_function"] == "gelu_pytorch_tanh",
          "{}: activation_function {} is not supported (paraflow implements gelu_new)", origin,
          json["activation_function"].dump());
  }
  c.validate(origin);
  return c;
}

nlohmann::json GptConfig::to_hf_json() const {
  return {{"model_type", "gpt2"},
          {"architectures", {"GPT2LMHeadModel"}},
          {"vocab_size", vocab_size},
          {"n_positions", n_positions},
          {"n_ctx", n_positions},
          {"n_embd", n_embd},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", layer_norm_epsilon},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true},
          {"bos_token_id", vocab_size - 1},
          {"eos_token_id", vocab_size - 1},
          {"torch_dtype", "float32"}};
}

void GptConfig::validate(const std::string& origin) const {
  check(vocab_size > 0, "{}: vocab_size must be positive, got {}", origin, vocab_size);
  check(n_positions > 0, "{}: n_positions must be positive, got {}", origin, n_positions);
  check(n_layer > 0, "{}: n_layer must be positive, got {}", origin, n_layer);
  check(n_head > 0 && n_embd > 0 && n_embd % n_head == 0, "{}: n_embd ({}) must be a positive multiple of n_head ({})",
        origin, n_embd, n_head);
  check(layer_norm_epsilon > 0, "{}: layer_norm_epsilon must be positive", origin);
}

int64_t GptConfig::parameter_count() const {
  int64_t C = n_embd;
  int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return vocab_size * C + n_positions * C + n_layer * per_layer + 2 * C;
}

double GptConfig::flops_per_token(int64_t sequence_length) const {
  return 6.0 * static_cast<double>(parameter_count()) +
         6.0 * static_cast<double>(n_layer * n_embd * sequence_length);
}

}  // namespace paraflow::model
