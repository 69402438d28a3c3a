#include "model/gpt_config.h"

#include <cmath>
#include <optional>

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
  c.tie_word_embeddings = config.get<bool>("model.tie_word_embeddings");
  if (config.get<std::string>("model.architecture") == "llama") {
    c.architecture = Architecture::llama;
    c.model_type = "llama";
    c.n_kv_head = config.get<int64_t>("model.n_kv_head");
    c.head_dim = config.get<int64_t>("model.head_dim");
    c.intermediate_size = config.get<int64_t>("model.intermediate_size");
    c.rope.theta = config.get<double>("model.rope_theta");
    check(c.intermediate_size > 0, "{}: model.intermediate_size is required (> 0) with model.architecture llama",
          config.origin());
  } else {
    // Llama-only keys given to a GPT-2 would be silently ignored: refused by name.
    for (const char* key : {"model.n_kv_head", "model.head_dim", "model.intermediate_size", "model.rope_theta"}) {
      check(!config.has(key), "{}: {} is a model.architecture llama key (architecture is gpt2)", config.origin(), key);
    }
  }
  c.validate(config.origin());
  return c;
}

namespace {

// Reads a Hugging Face config.json's fields, each error naming the file and the field.
class HfFields {
 public:
  HfFields(const nlohmann::json& json, const std::string& origin) : json_(json), origin_(origin) {}
  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }
  // transformers reads `alias` (hidden_size, ...) in place of `key` and lets it win over `key`,
  // so a config that has both must give one value. Absent: `fallback`, or an error without one.
  int64_t integer(const char* key, const char* alias = nullptr, std::optional<int64_t> fallback = {}) const {
    const bool has_alias = alias != nullptr && has(alias);
    const char* name = has_alias && !has(key) ? alias : key;
    if (!has(name) && fallback) return *fallback;
    check(has(name), "{}: missing field '{}'", origin_, key);
    check(json_[name].is_number_integer(), "{}: field '{}' must be an integer, got {}", origin_, name,
          json_[name].dump());
    if (has_alias) {
      check(json_[alias] == json_[name], "{}: field '{}' is {} but its alias '{}' is {}", origin_, name,
            json_[name].dump(), alias, json_[alias].dump());
    }
    return json_[name].get<int64_t>();
  }
  double number(const char* key, double fallback) const { return number_in(json_, key, fallback, key); }
  double number_in(const nlohmann::json& object, const char* key, std::optional<double> fallback,
                   const std::string& path) const {
    if (!object.contains(key) || object[key].is_null()) {
      check(fallback.has_value(), "{}: missing field '{}'", origin_, path);
      return *fallback;
    }
    check(object[key].is_number(), "{}: field '{}' must be a number, got {}", origin_, path, object[key].dump());
    return object[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!json_.contains(key)) return fallback;
    check(json_[key].is_boolean(), "{}: field '{}' must be true or false, got {}", origin_, key, json_[key].dump());
    return json_[key].get<bool>();
  }
  // Fails naming the field and its value unless `supported`.
  void refuse_unless(bool supported, const char* key, const std::string& what_we_implement) const {
    if (!supported) {
      fail("{}: field '{}' is {}, which paraflow does not implement ({})", origin_, key, json_.at(key).dump(),
           what_we_implement);
    }
  }
  const nlohmann::json& json() const { return json_; }
  const std::string& origin() const { return origin_; }

 private:
  const nlohmann::json& json_;
  const std::string& origin_;
};

// transformers' GPT2Config (4.49), field by field. Implemented: vocab_size, n_positions, n_embd,
// n_layer, n_head (or their aliases hidden_size, max_position_embeddings, num_hidden_layers,
// num_attention_heads), layer_norm_epsilon, scale_attn_weights, scale_attn_by_inverse_layer_idx,
// activation_function gelu_new or gelu_pytorch_tanh (both are the tanh GELU), n_inner null or
// 4*n_embd, and reorder_and_upcast_attn: it only makes float16/bfloat16 models compute attention
// scores in float32, which paraflow always does, so either value gives our maths.
// Refused unless at the default, as they change the model: other activations and n_inner,
// add_cross_attention, pruned_heads, quantization_config. tie_word_embeddings false: an
// lm_head.weight of its own. Ignored, as they do not change the logits: dropouts (resid_pdrop,
// embd_pdrop, attn_pdrop, summary_first_dropout), initializer_range, the summary_* fields of
// GPT2DoubleHeadsModel's head, use_cache, the token ids (bos, eos, pad), generation defaults,
// task_specific_params, torch_dtype (we compute in float32), n_ctx (unused by transformers),
// torchscript (copies the tied head instead of sharing it), output_* and bookkeeping
// (architectures, transformers_version, _name_or_path, ...).
GptConfig gpt2_from_hf(const HfFields& fields) {
  const nlohmann::json& json = fields.json();
  auto integer = [&](const char* key, const char* alias = nullptr) { return fields.integer(key, alias); };
  auto boolean = [&](const char* key, bool fallback) { return fields.boolean(key, fallback); };
  auto refuse_unless = [&](bool supported, const char* key, const std::string& what) {
    fields.refuse_unless(supported, key, what);
  };
  GptConfig c;
  c.vocab_size = integer("vocab_size");
  c.n_positions = integer("n_positions", "max_position_embeddings");
  c.n_embd = integer("n_embd", "hidden_size");
  c.n_layer = integer("n_layer", "num_hidden_layers");
  c.n_head = integer("n_head", "num_attention_heads");
  c.layer_norm_epsilon = fields.number("layer_norm_epsilon", c.layer_norm_epsilon);
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
  c.tie_word_embeddings = boolean("tie_word_embeddings", true);
  if (json.contains("pruned_heads")) {
    refuse_unless(json["pruned_heads"].empty(), "pruned_heads", "only no pruned heads");
  }
  return c;
}


// transformers' LlamaConfig, MistralConfig and Qwen2Config (4.49). Implemented: vocab_size,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, hidden_act silu, max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling
// null or of rope_type default, linear or llama3, tie_word_embeddings, attention_bias and
// mlp_bias (llama), Qwen2's q/k/v biases, and sliding_window (mistral; qwen2 with
// use_sliding_window): sequences longer than the window are refused where they are built.
// Refused: other activations and rope types, partial_rotary_factor other than 1,
// quantization_config. Ignored, as they do not change the logits: pretraining_tp (the same
// products in slices), dropouts, initializer_range, use_cache, token ids, torch_dtype,
// max_window_layers without a window, bookkeeping.
GptConfig llama_from_hf(const HfFields& fields, const std::string& model_type) {
  const nlohmann::json& json = fields.json();
  const std::string& origin = fields.origin();
  GptConfig c;
  c.architecture = Architecture::llama;
  c.model_type = model_type;
  c.vocab_size = fields.integer("vocab_size");
  c.n_embd = fields.integer("hidden_size");
  c.intermediate_size = fields.integer("intermediate_size");
  c.n_layer = fields.integer("num_hidden_layers");
  c.n_head = fields.integer("num_attention_heads");
  c.n_kv_head = fields.integer("num_key_value_heads", nullptr, c.n_head);
  c.head_dim = fields.integer("head_dim", nullptr, c.n_embd / c.n_head);
  const int64_t default_positions = model_type == "llama" ? 2048 : model_type == "mistral" ? 4096 * 32 : 32768;
  c.n_positions = fields.integer("max_position_embeddings", nullptr, default_positions);
  c.layer_norm_epsilon = fields.number("rms_norm_eps", 1e-6);
  c.rope.theta = fields.number("rope_theta", 10000.0);
  c.tie_word_embeddings = fields.boolean("tie_word_embeddings", false);
  if (json.contains("hidden_act")) fields.refuse_unless(json["hidden_act"] == "silu", "hidden_act", "only silu");
  if (fields.has("partial_rotary_factor")) {
    fields.refuse_unless(fields.number("partial_rotary_factor", 1.0) == 1.0, "partial_rotary_factor", "only 1.0");
  }
  if (fields.has("rope_scaling")) {
    const nlohmann::json& scaling = json["rope_scaling"];
    check(scaling.is_object(), "{}: field 'rope_scaling' must be an object or null, got {}", origin, scaling.dump());
    const char* type_key = scaling.contains("rope_type") ? "rope_type" : "type";
    const std::string type = scaling.contains(type_key) && scaling[type_key].is_string()
                                 ? scaling[type_key].get<std::string>() : "";
    check(type == "default" || type == "linear" || type == "llama3",
          "{}: field 'rope_scaling.{}' is {}, which paraflow does not implement (only default, linear and llama3)",
          origin, type_key, scaling.contains(type_key) ? scaling[type_key].dump() : "missing");
    auto field = [&](const char* key) {
      return fields.number_in(scaling, key, std::nullopt, std::string("rope_scaling.") + key);
    };
    if (type == "linear") {
      c.rope.scaling = RopeScaling::linear;
      c.rope.factor = field("factor");
    } else if (type == "llama3") {
      c.rope.scaling = RopeScaling::llama3;
      c.rope.factor = field("factor");
      c.rope.low_freq_factor = field("low_freq_factor");
      c.rope.high_freq_factor = field("high_freq_factor");
      c.rope.original_max_position = field("original_max_position_embeddings");
    }
  }
  if (model_type == "llama") {
    c.attention_bias = fields.boolean("attention_bias", false);
    c.mlp_bias = fields.boolean("mlp_bias", false);
  }
  c.qkv_bias = model_type == "qwen2";
  const bool windowed = model_type == "mistral" || (model_type == "qwen2" && fields.boolean("use_sliding_window", false));
  // An explicit null is no window; an absent field is the config class's default (Mistral's 4096).
  const bool null_window = json.contains("sliding_window") && json["sliding_window"].is_null();
  if (windowed && !null_window) {
    c.sliding_window = fields.integer("sliding_window", nullptr, model_type == "mistral" ? 4096 : 0);
  }
  return c;
}

}  // namespace

const char* architecture_name(Architecture architecture) {
  return architecture == Architecture::llama ? "llama" : "gpt2";
}

GptConfig GptConfig::from_hf_json(const nlohmann::json& json, const std::string& origin) {
  check(json.is_object(), "{}: expected a JSON object", origin);
  const HfFields fields(json, origin);
  const std::string model_type = json.contains("model_type") && json["model_type"].is_string()
                                     ? json["model_type"].get<std::string>() : "gpt2";
  check(!json.contains("model_type") || json["model_type"].is_string(), "{}: field 'model_type' must be a string, got {}",
        origin, json.contains("model_type") ? json["model_type"].dump() : "");
  check(model_type == "gpt2" || model_type == "llama" || model_type == "mistral" || model_type == "qwen2",
        "{}: model_type is \"{}\"; paraflow implements gpt2, llama, mistral and qwen2", origin, model_type);
  check(!json.contains("quantization_config"),
        "{}: field 'quantization_config' is present; paraflow does not implement quantized weights", origin);
  GptConfig c = model_type == "gpt2" ? gpt2_from_hf(fields) : llama_from_hf(fields, model_type);
  c.validate(origin);
  return c;
}

namespace {

nlohmann::json llama_hf_json(const GptConfig& c, const nlohmann::json& special) {
  const char* architecture = c.model_type == "mistral" ? "MistralForCausalLM"
                             : c.model_type == "qwen2" ? "Qwen2ForCausalLM"
                                                       : "LlamaForCausalLM";
  nlohmann::json rope_scaling = nullptr;
  if (c.rope.scaling == RopeScaling::linear) rope_scaling = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
  if (c.rope.scaling == RopeScaling::llama3) {
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", c.rope.factor},
                    {"low_freq_factor", c.rope.low_freq_factor},
                    {"high_freq_factor", c.rope.high_freq_factor},
                    // transformers wants an integer here
                    {"original_max_position_embeddings", static_cast<int64_t>(c.rope.original_max_position)}};
  }
  nlohmann::json json = {{"model_type", c.model_type},
                         {"architectures", {architecture}},
                         {"vocab_size", c.vocab_size},
                         {"hidden_size", c.n_embd},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.n_layer},
                         {"num_attention_heads", c.n_head},
                         {"num_key_value_heads", c.kv_heads()},
                         {"head_dim", c.head_size()},
                         {"hidden_act", "silu"},
                         {"max_position_embeddings", c.n_positions},
                         {"rms_norm_eps", c.layer_norm_epsilon},
                         {"rope_theta", c.rope.theta},
                         {"rope_scaling", rope_scaling},
                         {"tie_word_embeddings", c.tie_word_embeddings},
                         {"attention_dropout", 0.0},
                         {"initializer_range", 0.02},
                         {"bos_token_id", special},
                         {"eos_token_id", special},
                         {"torch_dtype", "float32"}};
  if (c.model_type == "llama") {
    json["attention_bias"] = c.attention_bias;
    json["mlp_bias"] = c.mlp_bias;
  }
  if (c.model_type == "mistral") json["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  if (c.model_type == "qwen2") {
    json["use_sliding_window"] = c.sliding_window > 0;
    json["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  }
  return json;
}

}  // namespace

nlohmann::json GptConfig::to_hf_json(int64_t end_of_text) const {
  const nlohmann::json special = end_of_text >= 0 ? nlohmann::json(end_of_text) : nlohmann::json(nullptr);
  if (is_llama()) return llama_hf_json(*this, special);
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
          {"tie_word_embeddings", tie_word_embeddings},
          {"bos_token_id", special},
          {"eos_token_id", special},
          {"torch_dtype", "float32"}};
}

void GptConfig::validate(const std::string& origin) const {
  check(vocab_size > 0, "{}: vocab_size must be positive, got {}", origin, vocab_size);
  check(n_positions > 0, "{}: n_positions must be positive, got {}", origin, n_positions);
  check(n_layer > 0, "{}: n_layer must be positive, got {}", origin, n_layer);
  if (is_llama()) {
    check(model_type == "llama" || model_type == "mistral" || model_type == "qwen2",
          "{}: model_type '{}' is not of the llama architecture (llama, mistral or qwen2)", origin, model_type);
    check(n_head > 0 && n_embd > 0 && head_size() > 0 && head_size() % 2 == 0,
          "{}: head_dim ({}) must be positive and even (rotary embeddings pair its halves)", origin, head_size());
    check(kv_heads() > 0 && n_head % kv_heads() == 0,
          "{}: num_key_value_heads ({}) must divide num_attention_heads ({})", origin, kv_heads(), n_head);
    check(intermediate_size > 0, "{}: intermediate_size must be positive, got {}", origin, intermediate_size);
    check(rope.theta > 0, "{}: rope_theta must be positive, got {}", origin, rope.theta);
    check(rope.scaling == RopeScaling::none || rope.factor > 0, "{}: rope_scaling.factor must be positive, got {}",
          origin, rope.factor);
    check(rope.scaling != RopeScaling::llama3 ||
              (rope.original_max_position >= 1 && std::floor(rope.original_max_position) == rope.original_max_position),
          "{}: rope_scaling.original_max_position_embeddings must be a positive integer, got {}", origin,
          rope.original_max_position);
    check(rope.scaling != RopeScaling::llama3 || rope.high_freq_factor > rope.low_freq_factor,
          "{}: rope_scaling.high_freq_factor ({}) must exceed low_freq_factor ({})", origin, rope.high_freq_factor,
          rope.low_freq_factor);
    // What each model_type's transformers class can express.
    check(model_type == "qwen2" ? qkv_bias && !attention_bias && !mlp_bias : !qkv_bias, "{}: {} has {}", origin,
          model_type, model_type == "qwen2" ? "q/k/v biases only" : "no separate q/k/v biases");
    check(model_type == "llama" || (!attention_bias && !mlp_bias), "{}: {} has no attention_bias or mlp_bias", origin,
          model_type);
  } else {
    check(model_type == "gpt2", "{}: model_type '{}' is not gpt2", origin, model_type);
    check(n_head > 0 && n_embd > 0 && n_embd % n_head == 0,
          "{}: n_embd ({}) must be a positive multiple of n_head ({})", origin, n_embd, n_head);
  }
  check(layer_norm_epsilon > 0, "{}: layer_norm_epsilon must be positive", origin);
  // Past these a typo allocates without end (or overflows parameter_count): refused by name.
  constexpr int64_t kMaxSize = int64_t{1} << 24, kMaxParameters = int64_t{1} << 40;
  for (const auto& [name, value] : {std::pair{"vocab_size", vocab_size}, std::pair{"n_positions", n_positions},
                                    std::pair{"n_layer", n_layer}, std::pair{"n_embd", n_embd}}) {
    check(value <= kMaxSize, "{}: {} {} is implausibly large (at most {})", origin, name, value, kMaxSize);
  }
  for (const auto& [name, value] : {std::pair{"intermediate_size", intermediate_size}, std::pair{"head_dim", head_dim},
                                    std::pair{"n_head", n_head}}) {
    check(value <= kMaxSize, "{}: {} {} is implausibly large (at most {})", origin, name, value, kMaxSize);
  }
  const double parameters = parameter_estimate();
  check(parameters <= static_cast<double>(kMaxParameters),
        "{}: {:.3g} parameters ({:.0f} GiB in float32) are more than this build handles", origin, parameters,
        parameters * 4 / (1 << 30));
}

double GptConfig::attention_scale(int64_t layer) const {
  if (is_llama()) return 1.0 / std::sqrt(static_cast<double>(head_size()));
  double scale = scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(n_embd / n_head)) : 1.0;
  return scale_attn_by_inverse_layer_idx ? scale / static_cast<double>(layer + 1) : scale;
}

// In double, so that validate() can bound it before anything overflows.
double GptConfig::parameter_estimate() const {
  const double C = static_cast<double>(n_embd), V = static_cast<double>(vocab_size);
  const double head = tie_word_embeddings ? 0.0 : V * C;
  if (!is_llama()) {
    return (V + static_cast<double>(n_positions)) * C + static_cast<double>(n_layer) * (12 * C * C + 13 * C) + 2 * C +
           head;
  }
  const double qkv = static_cast<double>(qkv_width()), attention_out = static_cast<double>(n_head * head_size());
  const double F = static_cast<double>(intermediate_size);
  const double attention = qkv * C + attention_out * C + (attention_bias || qkv_bias ? qkv : 0.0) +
                           (attention_bias ? C : 0.0);
  const double mlp = 3 * C * F + (mlp_bias ? 2 * F + C : 0.0);
  return V * C + static_cast<double>(n_layer) * (2 * C + attention + mlp) + C + head;
}

int64_t GptConfig::parameter_count() const { return static_cast<int64_t>(parameter_estimate()); }

void GptConfig::check_sequence_length(int64_t length, const std::string& what) const {
  check(length <= n_positions, "{} ({}) exceeds the model's {} ({})", what, length,
        is_llama() ? "max_position_embeddings" : "n_positions", n_positions);
  check(sliding_window == 0 || length <= sliding_window,
        "{} ({}) exceeds the model's sliding_window ({}); paraflow does not implement sliding-window attention, so "
        "sequences must fit in the window",
        what, length, sliding_window);
}

double GptConfig::flops_per_token(int64_t sequence_length) const {
  return 6.0 * static_cast<double>(parameter_count()) +
         6.0 * static_cast<double>(n_layer * n_head * head_size() * sequence_length);
}

}  // namespace paraflow::model
