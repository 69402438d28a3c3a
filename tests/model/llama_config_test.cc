// The Llama family's config.json (Llama 3.1, Mistral, Qwen2 as published) read field by field;
// every field that would change transformers' maths and that paraflow does not implement refused
// naming the file, field and value; graphs refuse what they cannot build yet; and the export
// holds LlamaForCausalLM's tensor names.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "backend/backend.h"
#include "base/error.h"
#include "base/file_io.h"
#include "expect_error.h"
#include "model/gpt_graph.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "model_configs.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

const std::string kOrigin = "llama/config.json";

// Meta-Llama-3.1-8B's config.json, its sizes shrunk.
nlohmann::json llama31() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 224, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 1000})");
}

TEST(LlamaConfig, Llama31FieldsAreRead) {
  const model::GptConfig c = model::GptConfig::from_hf_json(llama31(), kOrigin);
  EXPECT_TRUE(c.is_llama());
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.intermediate_size, 224);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_size(), 8);  // hidden_size / num_attention_heads without head_dim
  EXPECT_EQ(c.n_positions, 131072);
  EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.scaling, RopeScaling::llama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.original_max_position, 8192.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.attention_scale(1), 1.0 / std::sqrt(8.0));
  // Written back and read again: the same model.
  const model::GptConfig again = model::GptConfig::from_hf_json(c.to_hf_json(), kOrigin);
  EXPECT_EQ(again.to_hf_json(), c.to_hf_json());
  // Parameters: embedding, head, and per layer two norms, q/k/v/o and three MLP matrices, + the final norm.
  const int64_t per_layer = 2 * 64 + 64 * (8 + 2 * 2) * 8 + 64 * 64 + 3 * 64 * 224;
  EXPECT_EQ(c.parameter_count(), 2 * 1000 * 64 + 2 * per_layer + 64);
  EXPECT_EQ(c.parameter_count(), model::element_count(model::gpt_tensor_specs(c)));
}

TEST(LlamaConfig, MistralAndQwen2AreTheLlamaArchitecture) {
  const nlohmann::json mistral = nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 32, "head_dim": 16,
    "intermediate_size": 80, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 1, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 100})");
  const model::GptConfig m = model::GptConfig::from_hf_json(mistral, kOrigin);
  EXPECT_EQ(m.model_type, "mistral");
  EXPECT_EQ(m.head_size(), 16);  // explicit: not 32 / 4
  EXPECT_EQ(m.qkv_width(), (4 + 2) * 16);
  EXPECT_EQ(m.sliding_window, 0);
  EXPECT_FALSE(m.qkv_bias);
  const nlohmann::json qwen2 = nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 80,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
    "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "use_sliding_window": false, "vocab_size": 100})");
  const model::GptConfig q = model::GptConfig::from_hf_json(qwen2, kOrigin);
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.attention_bias);
  EXPECT_TRUE(q.tie_word_embeddings);
  EXPECT_EQ(q.sliding_window, 0);  // use_sliding_window false
  // Its export: LlamaForCausalLM's names, q/k/v stored apart, with biases; the head tied.
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(q);
  model::ParameterSet parameters(specs, cpu_backend());
  std::set<std::string> names;
  for (const auto& [name, tensor] : model::hf_tensors(parameters)) names.insert(name + " " + tensor.shape().to_string());
  for (const char* expected : {"model.embed_tokens.weight [100, 32]", "model.layers.0.self_attn.q_proj.weight [32, 32]",
                               "model.layers.0.self_attn.k_proj.weight [16, 32]", "model.layers.0.self_attn.v_proj.bias [16]",
                               "model.layers.0.self_attn.o_proj.weight [32, 32]", "model.layers.0.mlp.down_proj.weight [32, 80]",
                               "model.norm.weight [32]"}) {
    EXPECT_TRUE(names.count(expected)) << expected;
  }
  EXPECT_FALSE(names.count("lm_head.weight [100, 32]"));
  EXPECT_FALSE(names.count("model.layers.0.self_attn.o_proj.bias [32]"));
}

TEST(LlamaConfig, FieldsThatChangeTheMathsAreRefusedByName) {
  struct Refused {
    const char* field;
    nlohmann::json value;
    const char* says;
  };
  for (const Refused& r :
       {Refused{"hidden_act", "gelu", "only silu"}, Refused{"partial_rotary_factor", 0.5, "only 1.0"},
        Refused{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "rope_scaling.rope_type"},
        Refused{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}, "rope_scaling.type"},
        Refused{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}, "rope_scaling.low_freq_factor"},
        Refused{"num_key_value_heads", 3, "num_key_value_heads (3) must divide num_attention_heads (8)"},
        Refused{"head_dim", 7, "head_dim (7) must be positive and even"},
        Refused{"model_type", "gemma", "gemma"},
        Refused{"quantization_config", {{"quant_method", "awq"}}, "quantized"}}) {
    SCOPED_TRACE(r.field);
    nlohmann::json json = llama31();
    json[r.field] = r.value;
    testing::expect_error<InputError>([&] { model::GptConfig::from_hf_json(json, kOrigin); },
                                      {kOrigin, r.field, r.says});
  }
}

TEST(LlamaConfig, GraphsRefuseWhatIsNotImplementedYet) {
  model::GptConfig mistral = testing::llama_config("mistral", 50, 128, 16, 24, 1, 2, 1, 8);
  mistral.sliding_window = 32;
  // Sequences must fit in the sliding window (the window itself is not implemented).
  model::build_gpt_training_graph(mistral, 1, 32);
  testing::expect_error<InputError>([&] { model::build_gpt_training_graph(mistral, 1, 33); },
                                    {"sequence length (33)", "sliding_window (32)"});
  // Decoding to the model's whole context would pass the window.
  model::build_gpt_decode_graph(mistral, 1, 1, 32);
  testing::expect_error<InputError>([&] { model::build_gpt_decode_graph(mistral, 1, 1, 128); },
                                    {"decoding context (128)", "sliding_window (32)"});
  testing::expect_error<InputError>([&] { model::build_gpt_serving_decoder(mistral, 4, 4, 16); },
                                    {"serving context", "(128)", "sliding_window (32)"});
}

TEST(LlamaConfig, ExportLoadsBackAndATiedHeadMustEqualTheEmbedding) {
  model::GptConfig config = testing::llama_config("llama", 40, 32, 12, 20, 1, 4, 2, 4);
  config.tie_word_embeddings = true;
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  Rng rng(testing::test_seed());
  model::initialize_gpt(parameters, config, rng.next_u64());
  testing::TempDir dir;
  model::save_model_dir(dir.path(), config, parameters);
  const model::LoadedModel loaded = model::load_model_dir(dir.path(), cpu_backend());
  EXPECT_EQ(loaded.config.to_hf_json(), config.to_hf_json());
  for (size_t i = 0; i < parameters.specs().size(); ++i) {  // the loaded set maps the file: no flat buffer
    EXPECT_EQ(testing::to_vector(loaded.parameters.at(i)), testing::to_vector(parameters.at(i))) << parameters.specs()[i].name;
  }

  // transformers may save a tied head too: accepted when it equals the embedding, else refused.
  std::vector<std::pair<std::string, Tensor>> tensors = model::hf_tensors(parameters);
  Tensor head = Tensor::zeros(parameters.get("model.embed_tokens.weight").shape(), DType::f32);
  std::copy_n(parameters.get("model.embed_tokens.weight").data<float>(), head.numel(), head.data<float>());
  tensors.emplace_back("lm_head.weight", head);
  write_file_atomic(dir.path() / "model.safetensors", model::serialize_safetensors(tensors));
  model::load_model_dir(dir.path(), cpu_backend());
  head.data<float>()[3] += 1;
  write_file_atomic(dir.path() / "model.safetensors", model::serialize_safetensors(tensors));
  testing::expect_error<Error>([&] { model::load_model_dir(dir.path(), cpu_backend()); },
                               {"lm_head.weight differs from model.embed_tokens.weight", "tie_word_embeddings"});
}

}  // namespace
}  // namespace paraflow
