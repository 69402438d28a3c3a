// GptConfig from Hugging Face config.json and from our YAML: the attention-scaling fields are read,
// written and validated, and every field that would change the model's maths in transformers but
// that paraflow does not implement is refused with an error naming the file, field and value.
#include <gtest/gtest.h>

#include "base/config.h"
#include "base/error.h"
#include "model/gpt_config.h"
#include "model_configs.h"

namespace paraflow {
namespace {

const std::string kOrigin = "hf/config.json";

// Expects from_hf_json to throw InputError whose message contains every fragment.
void expect_refused(const nlohmann::json& json, const std::vector<std::string>& fragments) {
  try {
    model::GptConfig::from_hf_json(json, kOrigin);
    ADD_FAILURE() << "accepted " << json.dump() << "; expected an error with: " << fragments[0];
  } catch (const InputError& e) {
    std::string message = e.what();
    std::printf("  refused: %s\n", message.c_str());
    for (const std::string& fragment : fragments) EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

TEST(GptConfig, AttentionScalingRoundTripsThroughHfJson) {
  model::GptConfig config = testing::gpt_config(11, 8, 8, 3, 2);
  nlohmann::json defaults = config.to_hf_json();
  EXPECT_EQ(defaults["scale_attn_weights"], true);
  EXPECT_EQ(defaults["scale_attn_by_inverse_layer_idx"], false);
  // Head size 4: GPT-2 scales by 1/2 in every layer.
  EXPECT_DOUBLE_EQ(config.attention_scale(0), 0.5);
  EXPECT_DOUBLE_EQ(config.attention_scale(2), 0.5);

  config.scale_attn_weights = false;
  config.scale_attn_by_inverse_layer_idx = true;
  model::GptConfig loaded = model::GptConfig::from_hf_json(config.to_hf_json(), kOrigin);
  EXPECT_FALSE(loaded.scale_attn_weights);
  EXPECT_TRUE(loaded.scale_attn_by_inverse_layer_idx);
  EXPECT_DOUBLE_EQ(loaded.attention_scale(0), 1.0);
  EXPECT_DOUBLE_EQ(loaded.attention_scale(2), 1.0 / 3);
  loaded.scale_attn_weights = true;
  EXPECT_DOUBLE_EQ(loaded.attention_scale(2), 0.5 / 3);

  // A config without the fields has transformers' defaults.
  nlohmann::json bare = defaults;
  bare.erase("scale_attn_weights");
  bare.erase("scale_attn_by_inverse_layer_idx");
  model::GptConfig from_bare = model::GptConfig::from_hf_json(bare, kOrigin);
  EXPECT_TRUE(from_bare.scale_attn_weights);
  EXPECT_FALSE(from_bare.scale_attn_by_inverse_layer_idx);

  for (const char* field : {"scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    nlohmann::json bad = defaults;
    bad[field] = "no";
    expect_refused(bad, {kOrigin, field, "true or false", "\"no\""});
  }
}

TEST(GptConfig, HfFieldsThatChangeTheModelAreRefused) {
  const nlohmann::json defaults = testing::gpt_config(11, 8, 8, 1, 2).to_hf_json();
  struct Refused {
    const char* field;
    nlohmann::json value;
  };
  for (const Refused& r : {Refused{"n_inner", 48}, Refused{"activation_function", "relu"},
                           Refused{"add_cross_attention", true},
                           Refused{"pruned_heads", {{"0", {1}}}}, Refused{"num_attention_heads", 4},
                           Refused{"hidden_size", 16}, Refused{"quantization_config", {{"quant_method", "gptq"}}}}) {
    SCOPED_TRACE(r.field);
    nlohmann::json json = defaults;
    json[r.field] = r.value;
    // quantization_config's value is a whole object; the message names the field only.
    std::vector<std::string> fragments{kOrigin, r.field};
    if (std::string(r.field) != "quantization_config") fragments.push_back(r.value.dump());
    expect_refused(json, fragments);
  }
}

// A typo's size is refused by name before anything is allocated (or parameter_count overflows).
TEST(GptConfig, ImplausibleSizesAreRefusedByName) {
  const nlohmann::json defaults = testing::gpt_config(11, 8, 8, 1, 2).to_hf_json();
  nlohmann::json wide = defaults;
  wide["n_embd"] = 76800000;
  wide["n_head"] = 1;
  expect_refused(wide, {kOrigin, "n_embd 76800000 is implausibly large"});
  nlohmann::json deep = defaults;
  deep["n_layer"] = 1 << 20;
  deep["n_embd"] = 1 << 14;
  deep["n_head"] = 1;
  expect_refused(deep, {kOrigin, "parameters", "more than this build handles"});
}

TEST(GptConfig, HfFieldsThatKeepTheMathsAreAccepted) {
  nlohmann::json json = testing::gpt_config(11, 8, 8, 1, 2).to_hf_json();
  json["n_inner"] = 32;  // 4 * n_embd, written out
  json["activation_function"] = "gelu_pytorch_tanh";
  json["reorder_and_upcast_attn"] = true;
  json["add_cross_attention"] = false;
  json["pruned_heads"] = nlohmann::json::object();
  json["hidden_size"] = 8;  // transformers' alias of n_embd, agreeing with it
  for (const char* dropout : {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"}) json[dropout] = 0.1;
  json["initializer_range"] = 0.2;
  json["summary_type"] = "cls_index";
  json["use_cache"] = false;
  json["pad_token_id"] = 0;
  json["torch_dtype"] = "bfloat16";
  json["task_specific_params"] = {{"text-generation", {{"do_sample", true}, {"max_length", 50}}}};
  json["transformers_version"] = "4.49.0";
  model::GptConfig config = model::GptConfig::from_hf_json(json, kOrigin);
  EXPECT_EQ(config.n_embd, 8);

  // Only the aliases, as a hand-written config may have them.
  nlohmann::json aliases = testing::gpt_config(11, 8, 8, 1, 2).to_hf_json();
  for (auto [key, alias] : {std::pair{"n_positions", "max_position_embeddings"}, std::pair{"n_embd", "hidden_size"},
                            std::pair{"n_layer", "num_hidden_layers"}, std::pair{"n_head", "num_attention_heads"}}) {
    aliases[alias] = aliases[key];
    aliases.erase(key);
  }
  config = model::GptConfig::from_hf_json(aliases, kOrigin);
  EXPECT_EQ(config.n_positions, 8);
  EXPECT_EQ(config.n_embd, 8);
  EXPECT_EQ(config.n_layer, 1);
  EXPECT_EQ(config.n_head, 2);
}

}  // namespace
}  // namespace paraflow
