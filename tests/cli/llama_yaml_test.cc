// model.architecture llama in a run's YAML: its keys are read into the model config, required
// where the architecture needs them, and refused by name on a GPT-2.
#include <gtest/gtest.h>

#include "base/config.h"
#include "cli/config_schema.h"
#include "expect_error.h"
#include "model/gpt_config.h"

namespace paraflow {
namespace {

model::GptConfig read(const std::string& model_keys) {
  Config yaml = Config::from_string("model: {vocab_size: 50, n_positions: 64, n_embd: 24, n_layer: 2, n_head: 4, " +
                                        model_keys + "}\ndata: {train: corpus}",
                                    "run.yaml", cli::run_config_schema());
  yaml.validate();
  return model::GptConfig::from_config(yaml);
}

TEST(LlamaYaml, ArchitectureKeysAreRead) {
  const model::GptConfig c = read("architecture: llama, n_kv_head: 2, head_dim: 8, intermediate_size: 40, "
                                  "rope_theta: 500000, tie_word_embeddings: false, layer_norm_epsilon: 1e-6");
  EXPECT_TRUE(c.is_llama());
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.intermediate_size, 40);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_EQ(c.to_hf_json()["architectures"][0], "LlamaForCausalLM");
  // GPT-2 stays the default, and may have a head of its own.
  const model::GptConfig gpt2 = read("tie_word_embeddings: false");
  EXPECT_FALSE(gpt2.is_llama());
  EXPECT_FALSE(gpt2.tie_word_embeddings);
}

TEST(LlamaYaml, MissingAndMisplacedKeysAreRefusedByName) {
  testing::expect_error<InputError>([] { read("architecture: llama"); }, {"model.intermediate_size", "llama"});
  testing::expect_error<InputError>([] { read("architecture: llama, intermediate_size: 40, n_kv_head: 3"); },
                                    {"num_key_value_heads (3)", "num_attention_heads (4)"});
  testing::expect_error<InputError>([] { read("n_kv_head: 2"); }, {"model.n_kv_head", "llama key"});
  testing::expect_error<InputError>([] { read("architecture: bert"); }, {"model.architecture", "bert"});
}

}  // namespace
}  // namespace paraflow
