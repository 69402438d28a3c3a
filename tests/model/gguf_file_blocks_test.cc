// A GGUF file's Q4_K and Q8_0 matrices are decoded as the file holds them: a GPT-2 (Conv1D weights
// transposed in the file, one of them square) and a Llama (q/k rows in GGML's RoPE pair order,
// q/k/v fused in our parameter) written with random blocks, which no quantizer makes (so
// quantizing their values again would not give them back: checked), read back, then copied for
// decoding as the decoder does: every weight the decoder reads quantized holds the file's bytes,
// row for row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "backend/quantized_tiles.h"
#include "model/gguf_model.h"
#include "model/gguf_tensors.h"
#include "model/gpt_graph.h"
#include "model_configs.h"
#include "reference_runner.h"
#include "tensor/quantized.h"
#include "test_util.h"

namespace paraflow::model {
namespace {

namespace fs = std::filesystem;

// Random blocks: scales in a plausible range, every other byte (6-bit scales and minimums,
// quants) uniform, int8 quants down to -128 (ggml's Q8_0 quantizer never writes it).
void randomize_blocks(Tensor& tensor, Rng& rng) {
  auto* bytes = static_cast<uint8_t*>(tensor.raw());
  for (size_t i = 0; i < tensor.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(rng.next_u64());
  const int64_t blocks = tensor.numel() / dtype_block_elements(tensor.dtype());
  auto scale = [&](float from) { return f32_to_f16(from * static_cast<float>(1 + rng.next_u64() % 100) / 100); };
  for (int64_t b = 0; b < blocks; ++b) {
    if (tensor.dtype() == DType::q4_k) {
      auto& block = static_cast<BlockQ4_K*>(tensor.raw())[b];
      block.d = scale(0.002f);
      block.dmin = scale(0.001f);
    } else {
      static_cast<BlockQ8_0*>(tensor.raw())[b].d = scale(0.001f);
    }
  }
}

// `config`'s model with random parameters written in `type`, then each block-quantized tensor's
// blocks replaced by random ones.
void write_random_blocks(const fs::path& path, const GptConfig& config, DType type) {
  ParameterSet parameters(gpt_tensor_specs(config), cpu_backend());
  Rng rng(testing::test_seed());
  initialize_gpt(parameters, config, rng.next_u64());
  save_gguf_model(path, config, parameters, type, {});
  const GgufFile written = GgufFile::open(path);
  std::vector<std::pair<std::string, GgufValue>> metadata(written.metadata().begin(), written.metadata().end());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const GgufTensorInfo& info : written.tensors()) {
    Tensor copy = Tensor::zeros(info.shape, info.dtype);
    std::memcpy(copy.raw(), written.tensor(info.name).raw(), info.bytes);
    if (is_block_quantized(info.dtype)) randomize_blocks(copy, rng);
    tensors.emplace_back(info.name, copy);
  }
  write_gguf(path, metadata, tensors);
}

// The GGUF rows that make our parameter `name`'s rows, in order: the file's [out, in] rows, q/k
// rows moved from GGML's pairs (row h*hs + 2i + j) back to rotate-half order (h*hs + j*hs/2 + i).
std::vector<std::pair<std::string, int64_t>> file_rows(const GptConfig& config, const TensorSpec& spec,
                                                       const GgufFile& file) {
  std::vector<StoredPart> parts = spec.stored_as;
  if (parts.empty()) parts.push_back({spec.name, 0});
  std::vector<std::pair<std::string, int64_t>> rows;
  for (const StoredPart& part : parts) {
    const std::string name = gguf_placement(config, part.name).name;
    const int64_t count = file.tensor_info(name).shape[0];
    const bool pairs = config.model_type == "llama" && (part.name.find("q_proj") != std::string::npos ||
                                                        part.name.find("k_proj") != std::string::npos);
    const int64_t head_size = config.head_size();
    std::vector<int64_t> order(static_cast<size_t>(count));
    for (int64_t r = 0; r < count; ++r) {
      const int64_t head = r / head_size, i = (r % head_size) / 2, j = r % 2;
      order[static_cast<size_t>(pairs ? head * head_size + j * head_size / 2 + i : r)] = r;
    }
    for (int64_t r : order) rows.emplace_back(name, r);
  }
  return rows;
}

void expect_the_files_blocks(const GptConfig& config, DType type) {
  SCOPED_TRACE(config.model_type + " " + dtype_name(type));
  testing::TempDir dir;
  const fs::path path = dir.path() / "random.gguf";
  write_random_blocks(path, config, type);
  const GgufFile file = GgufFile::open(path);
  const LoadedModel loaded = load_gguf_model(file, cpu_backend());
  GptGraph g = build_gpt_decode_graph(config, 1, 1, config.n_positions);
  const StoredLayouts layouts = use_weights_for_decoding(g, cpu_backend(), type);
  const std::set<std::string> quantized = half_parameter_names(g);
  const ParameterSet copy = loaded.parameters.converted_copy(cpu_backend(), type, layouts, &quantized);
  ASSERT_FALSE(quantized.empty());
  size_t requantized_differ = 0;
  for (size_t i = 0; i < copy.specs().size(); ++i) {
    const TensorSpec& spec = copy.specs()[i];
    SCOPED_TRACE(spec.name);
    const Tensor& stored = copy.at(i);
    ASSERT_EQ(stored.dtype(), type);
    const size_t row_bytes = stored.nbytes() / static_cast<size_t>(stored.shape()[0]);
    const auto source = std::find_if(loaded.parameters.specs().begin(), loaded.parameters.specs().end(),
                                     [&](const TensorSpec& ours) { return ours.name == spec.name; });
    const auto rows = file_rows(config, *source, file);
    ASSERT_EQ(rows.size(), static_cast<size_t>(stored.shape()[0]));
    // The file's rows in order, then in the layout decoding stores them (out_in_tiles where the
    // backend multiplies that: backend/quantized_tiles.h).
    std::vector<char> expected(stored.nbytes());
    for (size_t r = 0; r < rows.size(); ++r) {
      std::memcpy(expected.data() + r * row_bytes,
                  static_cast<const char*>(file.tensor(rows[r].first).raw()) + rows[r].second * row_bytes, row_bytes);
    }
    std::vector<char> file_blocks = expected;
    if (layouts.tiled.count(spec.name)) {
      tile_quantized_rows(type, expected.data(), stored.shape()[0], stored.shape()[1]);
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      ASSERT_EQ(std::memcmp(static_cast<const char*>(stored.raw()) + r * row_bytes, expected.data() + r * row_bytes, row_bytes), 0)
          << "row " << r << (layouts.tiled.count(spec.name) ? " (tiled)" : "");
    }
    // Quantizing the blocks' values again gives other blocks: the copy did not.
    std::vector<float> values(static_cast<size_t>(stored.numel()));
    dequantize_blocks(type, file_blocks.data(), values.data(), stored.numel());
    std::vector<char> again(stored.nbytes());
    quantize_blocks(type, values.data(), again.data(), stored.numel());
    requantized_differ += std::memcmp(again.data(), file_blocks.data(), stored.nbytes()) != 0;
  }
  EXPECT_EQ(requantized_differ, copy.specs().size());
}

TEST(GgufFileBlocks, GptTwoDecodesTheFilesBlocks) {
  const GptConfig gpt2 = testing::gpt_config(97, 64, 256, 2, 4);  // rows of whole 256-value super-blocks
  expect_the_files_blocks(gpt2, DType::q4_k);
  expect_the_files_blocks(gpt2, DType::q8_0);
}

TEST(GgufFileBlocks, LlamaDecodesTheFilesBlocks) {
  GptConfig llama = testing::llama_config("llama", 96, 64, 256, 512, 2, 4, 2, 64);
  expect_the_files_blocks(llama, DType::q4_k);
  llama.model_type = "qwen2";  // no RoPE pairs in the file
  llama.qkv_bias = true;
  expect_the_files_blocks(llama, DType::q4_k);
}

}  // namespace
}  // namespace paraflow::model
