#include "model/gpt_config.h"

#include <cmath>

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
  c.scale_attn_weights = config.get<bool>("model.scale_attn_weights");
  c.scale_attn_by_inverse_layer_idx = config.get<bool>("model.scale_attn_by_inverse_layer_idx");
  c.validate(config.origin());
  return c;
}

// transformers' GPT2Config (4.49), field by field. Implemented: vocab_size, n_positions, n_embd,
// n_layer, n_head (or their aliases hidden_size, max_position_embeddings, num_hidden_layers,
// num_attention_heads), layer_norm_epsilon, scale_attn_weights, scale_attn_by_inverse_layer_idx,
// activation_function gelu_new or gelu_pytorch_tanh (both are the tanh GELU), n_inner null or
// 4*n_embd, and reorder_and_upcast_attn: it only makes float16/bfloat16 models compute attention
// scores in float32, which paraflow always does, so either value gives our maths.
// Refused unless at the default, as they change the model: other activations and n_inner,
// add_cross_attention, tie_word_embeddings false (an lm_head separate from wte), pruned_heads,
// quantization_config. Ignored, as they do not change the logits: dropouts (resid_pdrop,
// embd_pdrop, attn_pdrop, summary_first_dropout), initializer_range, the summary_* fields of
// GPT2DoubleHeadsModel's head, use_cache, the token ids (bos, eos, pad), generation defaults,
// task_specific_params, torch_dtype (we compute in float32), n_ctx (unused by transformers),
// torchscript (copies the tied head instead of sharing it), output_* and bookkeeping
// (architectures, transformers_version, _name_or_path, ...).
GptConfig GptConfig::from_hf_json(const nlohmann::json& json, const std::string& origin) {
  check(json.is_object(), "{}: expected a JSON object", origin);
  if (json.contains("model_type")) {
    check(json["model_type"] == "gpt2", "{}: model_type is {}, only gpt2 is supported", origin,
          json["model_type"].dump());
  }
  // transformers reads `alias` (hidden_size, ...) in place of `key` and lets it win over `key`,
  // so a config that has both must give one value.
  auto integer = [&](const char* key, const char* alias = nullptr) -> int64_t {
    const bool has_alias = alias != nullptr && json.contains(alias);
    const char* name = has_alias && !json.contains(key) ? alias : key;
    check(json.contains(name), "{}: missing field '{}'", origin, key);
    check(json[name].is_number_integer(), "{}: field '{}' must be an integer, got {}", origin, name, json[name].dump());
    if (has_alias) {
      check(json[alias] == json[name], "{}: field '{}' is {} but its alias '{}' is {}", origin, name, json[name].dump(),
            alias, json[alias].dump());
    }
    return json[name].get<int64_t>();
  };
  auto boolean = [&](const char* key, bool fallback) {
    if (!json.contains(key)) return fallback;
    check(json[key].is_boolean(), "{}: field '{}' must be true or false, got {}", origin, key, json[key].dump());
    return json[key].get<bool>();
  };
  auto refuse_unless = [&](bool supported, const char* key, const std::string& what_we_implement) {
    // The field may be absent when supported: read it only to name it in the refusal.
    if (!supported) {
      fail("{}: field '{}' is {}, which paraflow does not implement ({})", origin, key, json.at(key).dump(),
           what_we_implement);
    }
  };
  GptConfig c;
  c.vocab_size = integer("vocab_size");
  c.n_positions = integer("n_positions", "max_position_embeddings");
  c.n_embd = integer("n_embd", "hidden_size");
  c.n_layer = integer("n_layer", "num_hidden_layers");
  c.n_head = integer("n_head", "num_attention_heads");
  if (json.contains("layer_norm_epsilon")) {
    check(json["layer_norm_epsilon"].is_number(), "{}: field 'layer_norm_epsilon' must be a number, got {}", origin,
          json["layer_norm_epsilon"].dump());
    c.layer_norm_epsilon = json["layer_norm_epsilon"].get<double>();
  }
  c.scale_attn_weights = boolean("scale_attn_weights", true);
  c.scale_attn_by_inverse_layer_idx = boolean("scale_attn_by_inverse_layer_idx", false);
  boolean("reorder_and_upcast_attn", false);  // either value: see above
  if (json.contains("activation_function")) {
    refuse_unless(json["activation_function"] == "gelu_new" || json["activation_function"] == "gelu_pytorch_tanh",
                  "activation_function", "only gelu_new and gelu_pytorch_tanh");
  }
  if (json.contains("n_inner") && !json["n_inner"].is_null()) {
    refuse_unless(json["n_inner"] == 4 * c.n_embd, "n_inner",
                  fmt::format("only null or 4*n_embd = {}", 4 * c.n_embd));
  }
  refuse_unless(!boolean("add_cross_attention", false), "add_cross_attention", "only false");
  refuse_unless(boolean("tie_word_embeddings", true), "tie_word_embeddings",
                "only true: the head is the embedding table");
  if (json.contains("pruned_heads")) {
    refuse_unless(json["pruned_heads"].empty(), "pruned_heads", "only no pruned heads");
  }
  check(!json.contains("quantization_config"),
        "{}: field 'quantization_config' is present; paraflow does not implement quantized weights", origin);
  c.validate(origin);
  return c;
}

nlohmann::json GptConfig::to_hf_json(int64_t end_of_text) const {
  const nlohmann::json special = end_of_text >= 0 ? nlohmann::json(end_of_text) : nlohmann::json(nullptr);
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
          {"scale_attn_weights", scale_attn_weights},
          {"scale_attn_by_inverse_layer_idx", scale_attn_by_inverse_layer_idx},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true},
          {"bos_token_id", special},
          {"eos_token_id", special},
          {"torch_dtype", "float32"}};
}

void GptConfig::validate(const std::string& origin) const {
  check(vocab_size > 0, "{}: vocab_size must be positive, got {}", origin, vocab_size);
  check(n_positions > 0, "{}: n_positions must be positive, got {}", origin, n_positions);
  check(n_layer > 0, "{}: n_layer must be positive, got {}", origin, n_layer);
  check(n_head > 0 && n_embd > 0 && n_embd % n_head == 0, "{}: n_embd ({}) must be a positive multiple of n_head ({})",
        origin, n_embd, n_head);
  check(layer_norm_epsilon > 0, "{}: layer_norm_epsilon must be positive", origin);
  // Past these a typo allocates without end (or overflows parameter_count): refused by name.
  constexpr int64_t kMaxSize = int64_t{1} << 24, kMaxParameters = int64_t{1} << 40;
  for (const auto& [name, value] : {std::pair{"vocab_size", vocab_size}, std::pair{"n_positions", n_positions},
                                    std::pair{"n_layer", n_layer}, std::pair{"n_embd", n_embd}}) {
    check(value <= kMaxSize, "{}: {} {} is implausibly large (at most {})", origin, name, value, kMaxSize);
  }
  const double C = static_cast<double>(n_embd);  // parameter_count(), without int64 overflow
  const double parameters = static_cast<double>(vocab_size + n_positions) * C +
                            static_cast<double>(n_layer) * (12 * C * C + 13 * C) + 2 * C;
  check(parameters <= static_cast<double>(kMaxParameters),
        "{}: {:.3g} parameters ({:.0f} GiB in float32) are more than this build handles", origin, parameters,
        parameters * 4 / (1 << 30));
}

double GptConfig::attention_scale(int64_t layer) const {
  double scale = scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(n_embd / n_head)) : 1.0;
  return scale_attn_by_inverse_layer_idx ? scale / static_cast<double>(layer + 1) : scale;
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
