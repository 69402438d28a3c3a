// Serving costs the weights once: `paraflow generate`'s peak RSS on a 29M-parameter model, less
// the same command's on a near-empty model (what the binary, its libraries and the runtime cost),
// is the weights decoding reads, in the type it reads them, within 10%, plus twice its largest
// tensor in f32 (the one being converted) and 8 MiB. The file is served in place where decoding
// reads it as stored, and converted tensor by tensor from its mapping where not, each tensor's
// file pages let go once converted: whatever the file (f32 as we export it, bf16 with q/k/v apart
// as transformers saves the Llama family, GGUF). Before, the loader copied the file and decoding
// converted that copy: 2.0x the f32 weights with f32 decoding, 3.1x the bf16 ones, 5.3x the q8_0
// ones, all far above the bound.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "base/file_io.h"
#include "base/random.h"
#include "model/gguf_model.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "model_configs.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

namespace fs = std::filesystem;

constexpr double kMiB = 1024.0 * 1024.0;

// How the model is written: as `paraflow train` exports it (f32, our tensor order), as
// transformers saves a bf16 model (bf16, the names sorted: the Llama family's k_proj before
// q_proj), or as `paraflow quantize` writes a Q8_0 GGUF file.
enum class ModelFile : uint8_t { exported, transformers_bf16, gguf_q8_0 };

// A random model of `config` written in `dir` as `file` says; returns what generate's --model
// names. No tokenizer: generate reads and writes bytes, ids below 256.
fs::path write_model(const fs::path& dir, const model::GptConfig& config, ModelFile file) {
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  model::initialize_gpt(parameters, config, testing::test_seed());
  switch (file) {
    case ModelFile::exported: model::save_model_dir(dir, config, parameters); return dir;
    case ModelFile::transformers_bf16: {
      model::ParameterSet bf16(model::gpt_tensor_specs(config), cpu_backend(), DType::bf16);
      bf16.assign_converted(parameters);
      std::vector<std::pair<std::string, Tensor>> tensors = model::hf_tensors(bf16);
      std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      fs::create_directories(dir);
      write_file_atomic(dir / "config.json", config.to_hf_json().dump(2));
      write_file_atomic(dir / "model.safetensors", model::serialize_safetensors(tensors, {{"format", "pt"}}));
      return dir;
    }
    case ModelFile::gguf_q8_0:
      fs::create_directories(dir);
      model::save_gguf_model(dir / "model.gguf", config, parameters, DType::q8_0, {});
      return dir / "model.gguf";
  }
  return dir;
}

// The bytes of the weights decoding reads with `dtype` weights: the matrices (the linear layers' and
// the token embedding, which the head multiplies by) in that type, the rest (the position
// embedding, norms, biases) in f32.
double decoding_weight_bytes(const model::GptConfig& config, DType dtype) {
  double bytes = 0;
  for (const model::TensorSpec& spec : model::gpt_tensor_specs(config)) {
    const bool matrix = spec.shape.rank() == 2 && spec.name != "wpe.weight";
    bytes += static_cast<double>(dtype_bytes(matrix ? dtype : DType::f32, spec.shape.numel()));
  }
  return bytes;
}

// `paraflow generate`'s peak RSS in bytes, by /usr/bin/time. glibc's mmap threshold is fixed, as
// tests/dist/rank_memory_test.cc does (its dynamic threshold leaves freed buffers resident).
double generate_peak(const fs::path& model, const std::string& dtype, const fs::path& work) {
  const fs::path rss = work / "rss", log = work / "generate.log";
  const std::string command = fmt::format(
      "env MALLOC_MMAP_THRESHOLD_=131072 OMP_NUM_THREADS=1 /usr/bin/time -o {} -f %M {} generate --model {} "
      "--prompt ab --max-tokens 2 --temperature 0 --dtype {} > {} 2>&1",
      rss.string(), std::getenv("PARAFLOW_BINARY"), model.string(), dtype, log.string(), log.string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command << "\n" << read_file(log);
  EXPECT_TRUE(fs::exists(rss)) << command;
  return std::stod(read_file(rss)) * 1024;
}

struct Case {
  const char* name;
  ModelFile file;
  bool llama;        // a Llama-family model (q, k and v apart in its files), else GPT-2
  const char* flag;  // generate's --dtype
  DType dtype;
};

class ServingMemory : public ::testing::TestWithParam<Case> {};

TEST_P(ServingMemory, GenerateHoldsTheDecodingWeightsOnce) {
  ASSERT_NE(std::getenv("PARAFLOW_BINARY"), nullptr) << "PARAFLOW_BINARY: the paraflow binary (CTest sets it)";
  testing::TempDir dir;
  const Case& c = GetParam();
  // 28.9M parameters (GPT-2) or 28.2M (the Llama family's), 110 MiB in f32, nearly all in the
  // linear layers; a short context, so that the KV cache and activations (~5 MiB) stay small
  // beside them.
  const model::GptConfig config = c.llama ? testing::llama_config("qwen2", 256, 64, 768, 2048, 4, 12, 4, 64)
                                          : testing::gpt_config(256, 64, 768, 4, 12);
  const model::GptConfig near_empty = c.llama ? testing::llama_config("qwen2", 256, 64, 32, 64, 1, 2, 1, 16)
                                              : testing::gpt_config(256, 64, 32, 1, 2);
  const fs::path model = write_model(dir.path() / "model", config, c.file);
  const fs::path empty = write_model(dir.path() / "near-empty", near_empty, c.file);
  const double growth = generate_peak(model, c.flag, dir.path()) - generate_peak(empty, c.flag, dir.path());
  const double expected = decoding_weight_bytes(config, c.dtype) - decoding_weight_bytes(near_empty, c.dtype);
  const fs::path file = c.file == ModelFile::gguf_q8_0 ? model : model / "model.safetensors";
  std::printf("  %s: peak RSS grew %.1f MiB for %.1f MiB of decoding weights (%.2fx; the file %.1f MiB)\n", c.name,
              growth / kMiB, expected / kMiB, growth / expected, static_cast<double>(fs::file_size(file)) / kMiB);
  // The tensor being converted is resident twice at most: its file pages until converted, and for
  // q8_0 its f32 values in the stored layout (the MLP's, 9 MiB each). 10% and 8 MiB: the bigger
  // model's activations, KV cache and logits (~5 MiB) and its buffers' page rounding.
  const double largest = 768.0 * 3072 * sizeof(float);
  EXPECT_LE(growth, 1.10 * expected + 2 * largest + 8 * kMiB);
  // And the measurement sees the weights at all.
  EXPECT_GE(growth, 0.85 * expected);
}

// Before read_from_file, the bf16 files, the Llama family's with q/k/v apart and the GGUF files
// were read into an f32 copy first (GGUF in q8_0: its kept blocks and the decoding copy besides).
INSTANTIATE_TEST_SUITE_P(
    Files, ServingMemory,
    ::testing::Values(Case{"gpt2_f32_file_float32", ModelFile::exported, false, "float32", DType::f32},
                      Case{"gpt2_f32_file_bfloat16", ModelFile::exported, false, "bfloat16", DType::bf16},
                      Case{"gpt2_f32_file_q8_0", ModelFile::exported, false, "q8_0", DType::q8_0},
                      Case{"gpt2_bf16_file_bfloat16", ModelFile::transformers_bf16, false, "bfloat16", DType::bf16},
                      Case{"qwen2_bf16_file_bfloat16", ModelFile::transformers_bf16, true, "bfloat16", DType::bf16},
                      Case{"qwen2_bf16_file_q8_0", ModelFile::transformers_bf16, true, "q8_0", DType::q8_0},
                      Case{"gpt2_gguf_q8_0_q8_0", ModelFile::gguf_q8_0, false, "q8_0", DType::q8_0},
                      Case{"qwen2_gguf_q8_0_q8_0", ModelFile::gguf_q8_0, true, "q8_0", DType::q8_0}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace paraflow
