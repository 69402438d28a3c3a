// A GPT-2 saved as a Hugging Face dir, converted to a Q8_0 GGUF file as llama.cpp's converter
// writes one (tests/reference/gguf_files.py convert, with gguf-py's writer and quantizer, in
// .venv-data), which also writes the file's weights dequantized by gguf-py as a Hugging Face dir:
// read back, the file's model decodes with --dtype q8_0 exactly as that dir does (the same
// logits, bit for bit: the file's blocks are the blocks we quantize its values to), and its
// float32 parameters are the dequantized blocks.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "data/tokenizer.h"
#include "infer/generator.h"
#include "infer/text_codec.h"
#include "model/gguf_model.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "reference_runner.h"
#include "test_util.h"
#include "model_configs.h"

namespace paraflow {
namespace {

namespace fs = std::filesystem;

// A random small GPT-2 in `dir` with a byte-level BPE of its own (bytes, a few merges,
// <|endoftext|>) as vocab.json + merges.txt, which the converter carries into tokenizer.ggml.*.
void write_small_model(const fs::path& dir) {
  const model::GptConfig config = testing::gpt_config(97, 64, 64, 2, 2);
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  Rng rng(testing::test_seed());
  model::initialize_gpt(parameters, config, rng.next_u64());
  model::save_model_dir(dir, config, parameters);
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.push_back(std::string(1, static_cast<char>(byte)));
  tokens.insert(tokens.end(), {"th", "the", " the", "<|endoftext|>"});
  data::Tokenizer(tokens, {{'t', 'h'}, {256, 'e'}, {' ', 257}}, {259}).save(dir);
}

TEST(GgufGenerate, AQ8_0FileDecodesAsItsSafetensorsModelQuantizedAtLoad) {
  testing::TempDir dir;
  write_small_model(dir.path() / "hf");
  const fs::path root = testing::source_dir(), python = root / ".venv-data/bin/python";
  ASSERT_TRUE(fs::exists(python)) << python << " missing: run scripts/setup_python_data.sh";
  const std::string command = python.string() + " " + (root / "tests/reference/gguf_files.py").string() + " convert " +
                              (dir.path() / "hf").string() + " " + (dir.path() / "model.gguf").string() + " " +
                              (dir.path() / "dequantized").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  const model::LoadedModel from_gguf = model::load_model_dir(dir.path() / "model.gguf", cpu_backend());
  const model::LoadedModel from_hf = model::load_model_dir(dir.path() / "dequantized", cpu_backend());
  const model::LoadedModel original = model::load_model_dir(dir.path() / "hf", cpu_backend());
  EXPECT_EQ(from_gguf.config.n_embd, 64);
  EXPECT_EQ(from_gguf.config.vocab_size, 97);
  EXPECT_TRUE(from_gguf.config.tie_word_embeddings);
  // A linear weight: the file's Q8_0 blocks, dequantized and transposed back to [in, out].
  const model::GgufFile file = model::GgufFile::open(dir.path() / "model.gguf");
  const std::vector<float> blocks = model::gguf_values(file.tensor("blk.1.ffn_up.weight"));
  const Tensor& fc = from_gguf.parameters.get("h.1.mlp.c_fc.weight");  // [64, 256]
  for (int64_t r = 0; r < 64; r += 7) {
    for (int64_t c = 0; c < 256; c += 13) ASSERT_EQ(fc.data<float>()[r * 256 + c], blocks[static_cast<size_t>(c * 64 + r)]);
  }

  infer::Generator gguf(from_gguf.config, from_gguf.parameters, cpu_backend(), DType::q8_0);
  infer::Generator hf(from_hf.config, from_hf.parameters, cpu_backend(), DType::q8_0);
  const std::vector<int32_t> prompt{5, 17, 0, 42, 42, 8, 60};
  EXPECT_EQ(gguf.prefill(prompt), hf.prefill(prompt));
  infer::Sampler greedy_gguf({.temperature = 0}), greedy_hf({.temperature = 0});
  const std::vector<int32_t> ours = gguf.generate(prompt, 24, greedy_gguf).tokens;
  EXPECT_EQ(ours, hf.generate(prompt, 24, greedy_hf).tokens);
  // The file's tokenizer is the dir's.
  const infer::TextCodec gguf_text(dir.path() / "model.gguf"), hf_text(dir.path() / "hf");
  const std::string text = "the theme: <|endoftext|> then\xc3\xa9 the";
  EXPECT_EQ(gguf_text.encode(text), hf_text.encode(text));
  EXPECT_LT(gguf_text.encode(text).size(), text.size());  // merges applied
  EXPECT_EQ(gguf_text.end_of_text(), std::vector<int32_t>{259});
  // And they are not the original float32 weights' logits: the file's weights are quantized.
  infer::Generator f32(original.config, original.parameters, cpu_backend());
  EXPECT_NE(gguf.prefill(prompt), f32.prefill(prompt));
}

// paraflow quantize writes what the converter writes (gguf-py's GGUFReader finds the same keys,
// values and tensor bytes in both), and reads it back as it reads the converter's file.
TEST(GgufGenerate, QuantizeWritesTheConvertersFile) {
  testing::TempDir dir;
  write_small_model(dir.path() / "hf");
  const fs::path root = testing::source_dir(), python = root / ".venv-data/bin/python";
  const std::string oracle = python.string() + " " + (root / "tests/reference/gguf_files.py").string();
  const fs::path ours = dir.path() / "ours.gguf", theirs = dir.path() / "theirs.gguf";
  ASSERT_EQ(std::system((oracle + " convert " + (dir.path() / "hf").string() + " " + theirs.string()).c_str()), 0);
  const std::string quantize = fmt::format("{} quantize --model {} --type q8_0 --out {}", std::getenv("PARAFLOW_BINARY"),
                                           (dir.path() / "hf").string(), ours.string());
  ASSERT_EQ(std::system(quantize.c_str()), 0) << quantize;
  EXPECT_EQ(std::system((oracle + " compare " + ours.string() + " " + theirs.string()).c_str()), 0);
  const model::LoadedModel from_ours = model::load_model_dir(ours, cpu_backend());
  const model::LoadedModel from_theirs = model::load_model_dir(theirs, cpu_backend());
  infer::Generator a(from_ours.config, from_ours.parameters, cpu_backend(), DType::q8_0);
  infer::Generator b(from_theirs.config, from_theirs.parameters, cpu_backend(), DType::q8_0);
  EXPECT_EQ(a.prefill({1, 2, 3, 50}), b.prefill({1, 2, 3, 50}));
  EXPECT_EQ(infer::TextCodec(ours).encode("the theme"), infer::TextCodec(theirs).encode("the theme"));
}

TEST(GgufGenerate, RefusesAnotherArchitectureNamingTheKey) {
  testing::TempDir dir;
  const fs::path root = testing::source_dir(), python = root / ".venv-data/bin/python";
  const std::string command = python.string() + " " + (root / "tests/reference/gguf_files.py").string() + " write " +
                              dir.path().string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  // The test file says gpt2 but has none of its hyperparameters.
  try {
    model::load_model_dir(dir.path() / "written.gguf", cpu_backend());
    FAIL() << "a GGUF file without gpt2.* metadata loaded";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("gpt2.embedding_length"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace paraflow
