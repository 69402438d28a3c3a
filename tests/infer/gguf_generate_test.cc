// A GPT-2 saved as a Hugging Face dir, converted to a Q8_0 GGUF file as llama.cpp's converter
// writes one (tests/reference/gguf_files.py convert, with gguf-py's writer and quantizer, in
// .venv-data), which also writes the file's weights dequantized by gguf-py as a Hugging Face dir:
// read back, the file's model decodes with --dtype q8_0 exactly as that dir does (the same
// logits, bit for bit: the file's blocks are the blocks we quantize its values to), and its
// float32 parameters are the dequantized blocks. A Q4_K file paraflow quantize writes is read by
// gguf-py as the values we read, and decodes (its blocks as they are) as the float model it came
// from quantized at load; where rows are not whole Q4_K super-blocks, the file's matrices are Q5_0
// as llama.cpp's are.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "base/file_io.h"
#include "expect_error.h"
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
void write_small_model(const fs::path& dir, int64_t n_embd = 64, bool tied_head = true) {
  model::GptConfig config = testing::gpt_config(97, 64, n_embd, 2, 2);
  config.tie_word_embeddings = tied_head;
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

// `a` and `b` decode `prompt` alike with `weights`: the same logits and greedy tokens, bit for bit.
void expect_same_decoding(const model::GptConfig& config, const model::ParameterSet& a, const model::ParameterSet& b,
                          DType weights) {
  const std::vector<int32_t> prompt{5, 17, 0, 42, 42, 8, 60};
  infer::Generator from_a(config, a, cpu_backend(), weights), from_b(config, b, cpu_backend(), weights);
  EXPECT_EQ(from_a.prefill(prompt), from_b.prefill(prompt));
  infer::Sampler greedy_a({.temperature = 0}), greedy_b({.temperature = 0});
  EXPECT_EQ(from_a.generate(prompt, 12, greedy_a).tokens, from_b.generate(prompt, 12, greedy_b).tokens);
}

// A GGUF file's matrices are read from the mapped file when needed, and the embedding reads the
// token table's rows where the file holds them: decoding in the file's own quantized type takes
// its blocks whether or not their float values were read first, and decoding in bf16 from the
// file's rows and table decodes as it does from the same values in memory (no file behind them),
// bit for bit. A tied GPT-2 in Q8_0, an untied one in Q4_K, and one whose Q4_K matrices are Q5_0
// (rows of 64).
TEST(GgufGenerate, DecodesTheFileAsItDecodesTheValuesReadFromIt) {
  for (auto [type, n_embd, tied] : {std::tuple{DType::q8_0, 64, true}, std::tuple{DType::q4_k, 256, false},
                                    std::tuple{DType::q4_k, 64, false}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(type) << " n_embd " << n_embd);
    testing::TempDir dir;
    write_small_model(dir.path() / "hf", n_embd, tied);
    const model::LoadedModel original = model::load_model_dir(dir.path() / "hf", cpu_backend());
    model::save_gguf_model(dir.path() / "model.gguf", original.config, original.parameters, type, {});
    const model::GgufFile file = model::GgufFile::open(dir.path() / "model.gguf");
    const model::LoadedModel unread = model::load_gguf_model(file, cpu_backend());
    const model::LoadedModel read = model::load_gguf_model(file, cpu_backend());
    read.parameters.flat();  // every value read from the file
    model::ParameterSet in_memory(read.parameters.specs(), cpu_backend());
    in_memory.assign_converted(read.parameters);
    expect_same_decoding(unread.config, unread.parameters, read.parameters, type);
    expect_same_decoding(unread.config, unread.parameters, in_memory, DType::bf16);
  }
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

// paraflow quantize --type q4_k of a GPT-2 `n_embd` wide: gguf-py's GGUFReader finds every matrix
// in Q4_K (the head's and the embeddings' too) where its rows are whole 256-value super-blocks,
// else in Q5_0 as llama-quantize falls back (said once on stderr), and every vector in F32, and
// dequantizes each to the values we read. The file decodes with --dtype q4_k (its Q4_K blocks as
// they are) as the float model it was written from does quantized at load, its embedding tables
// (read in float32) and its Q5_0 matrices (dequantized and quantized again at load) the file's
// values: the same logits, bit for bit, so each tensor went to its parameter, in its type. (The
// head is untied: a tied one would be both.)
void check_quantized_q4_k_file(int64_t n_embd) {
  testing::TempDir dir;
  write_small_model(dir.path() / "hf", n_embd, /*tied_head=*/false);
  const fs::path root = testing::source_dir(), python = root / ".venv-data/bin/python";
  const fs::path file_path = dir.path() / "q4_k.gguf", theirs = dir.path() / "theirs";
  const std::string quantize = fmt::format("{} quantize --model {} --type q4_k --out {} 2>{}", std::getenv("PARAFLOW_BINARY"),
                                           (dir.path() / "hf").string(), file_path.string(), (dir.path() / "stderr").string());
  ASSERT_EQ(std::system(quantize.c_str()), 0) << quantize;
  const std::string said = read_file(dir.path() / "stderr");
  if (n_embd % 256 == 0) {
    EXPECT_EQ(said.find("q5_0"), std::string::npos) << said;
  } else {  // of the 11 matrices (2 embeddings, the untied head, 4 per layer) every one but the 2 MLP
            // down projections (rows of 4 n_embd) falls back
    EXPECT_NE(said.find("q4_k: 9 of 11 matrices have rows that are not whole 256-value blocks: q5_0 instead"),
              std::string::npos) << said;
    EXPECT_NE(said.find("blk.N.attn_qkv.weight"), std::string::npos) << said;
    EXPECT_NE(said.find("output.weight"), std::string::npos) << said;
    EXPECT_EQ(said.find("ffn_down"), std::string::npos) << said;
  }
  fs::create_directories(theirs);
  const std::string dequantize = python.string() + " " + (root / "tests/reference/gguf_files.py").string() +
                                 " dequantize " + file_path.string() + " " + theirs.string();
  ASSERT_EQ(std::system(dequantize.c_str()), 0) << dequantize;
  const nlohmann::json types = nlohmann::json::parse(read_file(theirs / "types.json"));
  const model::GgufFile file = model::GgufFile::open(file_path);
  ASSERT_EQ(types.size(), file.tensors().size());
  auto their_values = [&](const std::string& name) {
    const std::string bytes = read_file(theirs / (name + ".f32"));
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  };
  for (const model::GgufTensorInfo& info : file.tensors()) {
    SCOPED_TRACE(info.name);
    const bool whole_super_blocks = info.shape[info.shape.rank() - 1] % 256 == 0;
    EXPECT_EQ(types[info.name].get<std::string>(), info.shape.rank() == 1 ? "F32" : whole_super_blocks ? "Q4_K" : "Q5_0");
    EXPECT_EQ(model::gguf_values(file.tensor(info.name)), their_values(info.name));
  }

  // The file's Q4_K blocks, read as they are, are the blocks we quantize the float model to (our
  // quantizer is ggml's, byte for byte).
  const model::LoadedModel from_file = model::load_model_dir(file_path, cpu_backend());
  ASSERT_FALSE(from_file.config.tie_word_embeddings);
  model::LoadedModel from_dir = model::load_model_dir(dir.path() / "hf", cpu_backend());
  model::ParameterSet written(from_dir.parameters.specs(), cpu_backend());  // the loaded set maps the file: read-only
  written.assign_converted(from_dir.parameters);
  // llama.cpp's names for GPT-2's tensors; the linear layers' weights it holds [out, in].
  std::vector<std::tuple<std::string, std::string, bool>> names{{"wte.weight", "token_embd.weight", false},
                                                                {"wpe.weight", "position_embd.weight", false},
                                                                {"lm_head.weight", "output.weight", false}};
  for (int layer = 0; layer < 2; ++layer) {
    for (const auto& [ours, theirs] : {std::pair{"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"},
                                       {"mlp.c_fc", "ffn_up"}, {"mlp.c_proj", "ffn_down"}}) {
      names.emplace_back(fmt::format("h.{}.{}.weight", layer, ours), fmt::format("blk.{}.{}.weight", layer, theirs), true);
    }
  }
  written.write_on_host([&](model::ParameterSet& host) {
    for (const auto& [ours, theirs, transposed] : names) {
      // Embeddings are read in float32; a Q4_K matrix stays the float model's, as the file's blocks.
      const bool embedding = ours == "wte.weight" || ours == "wpe.weight";
      if (!embedding && types[theirs].get<std::string>() == "Q4_K") continue;
      const std::vector<float> values = their_values(theirs);
      const Tensor& tensor = host.get(ours);
      ASSERT_EQ(values.size(), static_cast<size_t>(tensor.numel())) << ours;
      const int64_t rows = tensor.shape()[0], columns = tensor.numel() / rows;  // ours: [in, out] when transposed
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < columns; ++c) {
          tensor.data<float>()[r * columns + c] = values[static_cast<size_t>(transposed ? c * rows + r : r * columns + c)];
        }
      }
    }
  });
  infer::Generator a(from_file.config, from_file.parameters, cpu_backend(), DType::q4_k);
  infer::Generator b(from_dir.config, written, cpu_backend(), DType::q4_k);
  const std::vector<int32_t> prompt{5, 17, 0, 42, 42, 8, 60};
  EXPECT_EQ(a.prefill(prompt), b.prefill(prompt));
  infer::Sampler greedy_a({.temperature = 0}), greedy_b({.temperature = 0});
  EXPECT_EQ(a.generate(prompt, 16, greedy_a).tokens, b.generate(prompt, 16, greedy_b).tokens);
  // Not the float32 model's logits: the weights are quantized.
  infer::Generator f32(from_dir.config, written, cpu_backend());
  EXPECT_NE(a.prefill(prompt), f32.prefill(prompt));
}

TEST(GgufGenerate, QuantizeQ4_KWritesAFileGgufPyReadsAndThatDecodesAsQuantizedAtLoad) {
  check_quantized_q4_k_file(256);  // rows of whole 256-value super-blocks
}

// Rows of 64 (Qwen2.5-0.5B's are 896): Q5_0 but for the MLP's down projection, whose rows are 256.
TEST(GgufGenerate, QuantizeQ4_KFallsBackToQ5_0AsLlamaCppWhereRowsAreNotWholeSuperBlocks) {
  check_quantized_q4_k_file(64);
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
