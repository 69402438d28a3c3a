// Llama-family GGUF files both ways, against llama.cpp's converter as tests/reference/gguf_llama.py
// re-enacts it with gguf-py (in .venv-data): a random Llama (plain heads, linear rope scaling),
// Llama 3 (grouped k/v heads, llama3 rope scaling as rope_freqs, untied head), Mistral and Qwen2
// (q/k/v biases, tied head) saved as Hugging Face dirs and converted in F32 read back as exactly
// their weights (q/k rows un-permuted), with the config the dir has; `paraflow quantize` writes,
// in F32, F16, BF16 and Q8_0, the keys, tensors and bytes the converter writes; and broken files
// are refused naming the key.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "gguf_llama_cases.h"
#include "model/gguf_model.h"
#include "model/model_files.h"
#include "random_llama.h"

namespace paraflow::model {
namespace {

namespace fs = std::filesystem;

class GgufLlama : public ::testing::TestWithParam<testing::GgufLlamaCase> {
 protected:
  void SetUp() override {
    Rng rng(testing::test_seed());
    parameters = testing::random_llama_parameters(GetParam().config, rng);
    save_model_dir(hf_dir(), GetParam().config, parameters);
  }
  fs::path hf_dir() const { return dir.path() / "hf"; }

  testing::TempDir dir;
  ParameterSet parameters;
};

void expect_same_parameters(const ParameterSet& a, const ParameterSet& b) {
  ASSERT_EQ(a.specs().size(), b.specs().size());
  for (size_t i = 0; i < a.specs().size(); ++i) {
    const Tensor& x = a.at(i);
    const Tensor& y = b.at(i);
    ASSERT_EQ(x.shape(), y.shape()) << a.specs()[i].name;
    EXPECT_TRUE(std::equal(x.data<float>(), x.data<float>() + x.numel(), y.data<float>())) << a.specs()[i].name;
  }
}

TEST_P(GgufLlama, TheConvertersFileReadsAsTheHuggingFaceDir) {
  const fs::path file = dir.path() / "model.gguf";
  ASSERT_EQ(testing::gguf_llama_oracle(fmt::format("convert {} {} f32", hf_dir().string(), file.string())), 0);
  const LoadedModel loaded = load_model_dir(file, cpu_backend());
  const GptConfig& want = GetParam().config;
  const GptConfig& got = loaded.config;
  EXPECT_EQ(got.model_type, want.model_type == "qwen2" ? "qwen2" : "llama");  // Mistral is written as llama
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.n_positions, want.n_positions);
  EXPECT_EQ(got.n_layer, want.n_layer);
  EXPECT_EQ(got.n_head, want.n_head);
  EXPECT_EQ(got.kv_heads(), want.kv_heads());
  EXPECT_EQ(got.head_size(), want.head_size());
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_FLOAT_EQ(got.layer_norm_epsilon, want.layer_norm_epsilon);
  EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings);
  EXPECT_EQ(got.qkv_bias, want.qkv_bias);
  EXPECT_EQ(got.rope.scaling, want.rope.scaling);
  EXPECT_DOUBLE_EQ(got.rope.theta, want.rope.theta);
  if (want.rope.scaling != RopeScaling::none) {
    EXPECT_NEAR(got.rope.factor, want.rope.factor, 1e-5);
  }
  if (want.rope.scaling == RopeScaling::llama3) {
    EXPECT_DOUBLE_EQ(got.rope.low_freq_factor, 1);
    EXPECT_NEAR(got.rope.high_freq_factor, want.rope.high_freq_factor, 1e-3);
    EXPECT_EQ(got.rope.original_max_position, want.rope.original_max_position);
  }
  expect_same_parameters(loaded.parameters, parameters);
}

TEST_P(GgufLlama, QuantizeWritesTheConvertersFile) {
  const std::vector<std::string> types =
      GetParam().config.rope.scaling == RopeScaling::llama3 ? std::vector<std::string>{"f32", "f16", "bf16", "q8_0"}
                                                            : std::vector<std::string>{"f32", "q8_0"};
  for (const std::string& type : types) {
    const fs::path ours = dir.path() / (type + ".gguf");
    const std::string quantize = fmt::format("{} quantize --model {} --type {} --out {} 2>/dev/null",
                                             std::getenv("PARAFLOW_BINARY"), hf_dir().string(), type, ours.string());
    ASSERT_EQ(std::system(quantize.c_str()), 0) << quantize;
    EXPECT_EQ(testing::gguf_llama_oracle(fmt::format("read {} {} {}", ours.string(), hf_dir().string(), type)), 0) << type;
    if (type == "f32") expect_same_parameters(load_model_dir(ours, cpu_backend()).parameters, parameters);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GgufLlama, ::testing::ValuesIn(testing::gguf_llama_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// The converter's Llama 3 file with one key changed (or removed: `value` empty) must be refused
// with an error naming `named`.
class BrokenLlamaFile : public ::testing::Test {
 protected:
  void SetUp() override {
    Rng rng(testing::test_seed());
    config = testing::gguf_llama_cases()[1].config;
    save_model_dir(dir.path() / "hf", config, testing::random_llama_parameters(config, rng));
    ASSERT_EQ(testing::gguf_llama_oracle(
                  fmt::format("convert {} {} f32", (dir.path() / "hf").string(), (dir.path() / "good.gguf").string())),
              0);
  }
  void expect_refused(const std::string& key, const std::optional<GgufValue>& value, const std::string& named) {
    const GgufFile good = GgufFile::open(dir.path() / "good.gguf");
    std::vector<std::pair<std::string, GgufValue>> metadata;
    for (const auto& [name, original] : good.metadata()) {
      if (name == key && !value) continue;
      if (!name.starts_with("GGUF.")) metadata.emplace_back(name, name == key ? *value : original);
    }
    if (value && !good.contains(key)) metadata.emplace_back(key, *value);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const GgufTensorInfo& info : good.tensors()) tensors.emplace_back(info.name, good.tensor(info.name));
    const fs::path bad = dir.path() / "bad.gguf";
    write_gguf(bad, metadata, tensors);
    try {
      load_model_dir(bad, cpu_backend());
      ADD_FAILURE() << key << ": the broken file loaded";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(named), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(bad.string()), std::string::npos) << error.what();
    }
  }

  testing::TempDir dir;
  GptConfig config;
};

TEST_F(BrokenLlamaFile, RefusedNamingTheKey) {
  expect_refused("general.architecture", gguf_string("falcon"), "general.architecture 'falcon'");
  expect_refused("llama.attention.layer_norm_rms_epsilon", std::nullopt, "llama.attention.layer_norm_rms_epsilon");
  expect_refused("llama.block_count", std::nullopt, "llama.block_count");
  expect_refused("llama.attention.head_count_kv", gguf_u32(3), "llama.attention.head_count_kv 3");
  expect_refused("llama.rope.dimension_count", gguf_u32(8), "llama.rope.dimension_count 8");
  expect_refused("llama.rope.scaling.type", gguf_string("yarn"), "llama.rope.scaling.type 'yarn'");
  expect_refused("llama.attention.value_length", gguf_u32(32), "llama.attention.value_length 32");
  expect_refused("llama.embedding_length", gguf_u32(48), "token_embd.weight");
}

}  // namespace
}  // namespace paraflow::model
