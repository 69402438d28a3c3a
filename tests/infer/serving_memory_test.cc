// Serving costs the weights once: `paraflow generate`'s peak RSS on a 29M-parameter model, less
// the same command's on a near-empty model (what the binary, its libraries and the runtime cost),
// is the weights decoding reads, in the type it reads them, within 10%, plus twice its largest
// tensor in f32 (the one being converted) and 8 MiB. The file is served in place where decoding
// reads it as stored, and converted tensor by tensor from its mapping where not, each tensor's
// file pages let go once converted. Before, the loader copied the file and decoding converted
// that copy: 2.0x the f32 weights with f32 decoding, 3.1x the bf16 ones, 5.3x the q8_0 ones,
// all far above the bound.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "base/file_io.h"
#include "base/random.h"
#include "model/model_files.h"
#include "model_configs.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

namespace fs = std::filesystem;

constexpr double kMiB = 1024.0 * 1024.0;

// A random GPT-2 of `config` in `dir`, as `paraflow train` exports it (no tokenizer: generate reads
// and writes bytes, ids below 256).
void write_model(const fs::path& dir, const model::GptConfig& config) {
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  model::initialize_gpt(parameters, config, testing::test_seed());
  model::save_model_dir(dir, config, parameters);
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

struct Weights {
  const char* flag;  // generate's --dtype
  DType dtype;
};

class ServingMemory : public ::testing::TestWithParam<Weights> {};

TEST_P(ServingMemory, GenerateHoldsTheDecodingWeightsOnce) {
  ASSERT_NE(std::getenv("PARAFLOW_BINARY"), nullptr) << "PARAFLOW_BINARY: the paraflow binary (CTest sets it)";
  testing::TempDir dir;
  // 28.9M parameters, 110 MiB in f32, nearly all in the linear layers; a short context, so that
  // the KV cache and activations (~5 MiB) stay small beside them.
  const model::GptConfig config = testing::gpt_config(256, 64, 768, 4, 12);
  const model::GptConfig near_empty = testing::gpt_config(256, 64, 32, 1, 2);
  write_model(dir.path() / "model", config);
  write_model(dir.path() / "near-empty", near_empty);
  const std::string dtype = GetParam().flag;
  const DType weights = GetParam().dtype;
  const double growth =
      generate_peak(dir.path() / "model", dtype, dir.path()) - generate_peak(dir.path() / "near-empty", dtype, dir.path());
  const double expected = decoding_weight_bytes(config, weights) - decoding_weight_bytes(near_empty, weights);
  std::printf("  %s: peak RSS grew %.1f MiB for %.1f MiB of decoding weights (%.2fx; the f32 file %.1f MiB)\n",
              dtype.c_str(), growth / kMiB, expected / kMiB, growth / expected,
              static_cast<double>(fs::file_size(dir.path() / "model/model.safetensors")) / kMiB);
  // The tensor being converted is resident twice at most: its file pages until converted, and for
  // q8_0 its f32 values in the stored layout (the MLP's, 9 MiB each). 10% and 8 MiB: the bigger
  // model's activations, KV cache and logits (~5 MiB) and its buffers' page rounding.
  const double largest = 768.0 * 3072 * sizeof(float);
  EXPECT_LE(growth, 1.10 * expected + 2 * largest + 8 * kMiB);
  // And the measurement sees the weights at all.
  EXPECT_GE(growth, 0.85 * expected);
}

INSTANTIATE_TEST_SUITE_P(Types, ServingMemory,
                         ::testing::Values(Weights{"float32", DType::f32}, Weights{"bfloat16", DType::bf16},
                                           Weights{"q8_0", DType::q8_0}),
                         [](const ::testing::TestParamInfo<Weights>& info) { return std::string(info.param.flag); });

}  // namespace
}  // namespace paraflow
