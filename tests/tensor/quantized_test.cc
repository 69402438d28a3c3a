// Q8_0, Q4_K and Q5_0 blocks against ggml's as the `gguf` package implements them
// (tests/reference/gguf_quants.py in .venv-data: scripts/setup_python_data.sh): our Q8_0 blocks must
// be its blocks byte for byte, our Q5_0 blocks too but where its float64 arithmetic rounds a tie
// otherwise, and our dequantized values of all three its values. The package
// has no Q4_K quantizer: ours is checked by what the reference algorithm guarantees (every value
// on the nearest point of its sub-block's stored grid, the grid spanning the values); byte for byte against llama.cpp's own quantizer it is
// checked by bench/infer/check_quantizers.sh, which needs the bench-only llama.cpp build.
// Missing oracle: the test fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/random.h"
#include "reference_runner.h"
#include "tensor/dtype.h"
#include "tensor/quantized.h"
#include "test_util.h"

namespace paraflow {
namespace {

namespace fs = std::filesystem;

// Runs the oracle: `action` (quantize or dequantize) of `type` from `in` to `out`.
bool run_gguf_quants(const std::string& action, const std::string& type, const fs::path& in, const fs::path& out) {
  const fs::path root = testing::source_dir(), python = root / ".venv-data/bin/python";
  const fs::path oracle = root / "tests/reference/gguf_quants.py";
  if (!fs::exists(python)) {
    ADD_FAILURE() << python << " missing: run scripts/setup_python_data.sh";
    return false;
  }
  const std::string command = python.string() + " " + oracle.string() + " " + action + " " + type + " " + in.string() +
                              " " + out.string();
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << "oracle failed: " << command;
  return status == 0;
}

template <typename T>
void write_raw(const fs::path& path, const std::vector<T>& values) {
  write_file_atomic(path, std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)));
}

template <typename T>
std::vector<T> read_raw(const fs::path& path) {
  const std::string bytes = read_file(path.string());
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// Blocks of every kind a quantizer can get wrong: Gaussian values at several scales, an all-zero
// block, values exactly halfway between two steps (ties round away from zero), a single outlier,
// tiny (float16-subnormal scale) and huge values, and negative maxima.
std::vector<float> awkward_values() {
  Rng rng(testing::test_seed());
  std::vector<float> values;
  for (double scale : {1.0, 0.02, 1e-3, 300.0}) {
    for (int i = 0; i < 32 * 40; ++i) values.push_back(static_cast<float>(rng.normal() * scale));
  }
  values.insert(values.end(), 32, 0.0f);
  for (int i = 0; i < 32; ++i) values.push_back(i == 0 ? 127.0f : static_cast<float>(i % 9) - 4.5f);  // d = 1: ties
  for (int i = 0; i < 32; ++i) values.push_back(i == 7 ? -50.0f : 0.01f * static_cast<float>(i));
  for (int i = 0; i < 32; ++i) values.push_back(1e-7f * static_cast<float>(i - 16));
  for (int i = 0; i < 32; ++i) values.push_back(6e4f * static_cast<float>(i % 5 - 2) / 2);
  return values;
}

TEST(Quantized, Q8_0BlocksAreGgmlsByteForByte) {
  testing::TempDir dir;
  const std::vector<float> values = awkward_values();
  std::vector<BlockQ8_0> ours(values.size() / 32);
  quantize_q8_0(values.data(), ours.data(), static_cast<int64_t>(values.size()));
  write_raw(dir.path() / "values.f32", values);
  ASSERT_TRUE(run_gguf_quants("quantize", "q8_0", dir.path() / "values.f32", dir.path() / "theirs.bin"));
  const std::vector<uint8_t> theirs = read_raw<uint8_t>(dir.path() / "theirs.bin");
  ASSERT_EQ(theirs.size(), ours.size() * sizeof(BlockQ8_0));
  for (size_t b = 0; b < ours.size(); ++b) {
    ASSERT_EQ(std::memcmp(&ours[b], theirs.data() + b * sizeof(BlockQ8_0), sizeof(BlockQ8_0)), 0) << "block " << b;
  }

  // Dequantized: the same floats, and each within half a step (d / 2) of the value quantized.
  std::vector<float> back(values.size());
  dequantize_q8_0(ours.data(), back.data(), static_cast<int64_t>(values.size()));
  write_raw(dir.path() / "ours.bin", ours);
  ASSERT_TRUE(run_gguf_quants("dequantize", "q8_0", dir.path() / "ours.bin", dir.path() / "back.f32"));
  const std::vector<float> their_back = read_raw<float>(dir.path() / "back.f32");
  ASSERT_EQ(their_back.size(), back.size());
  for (size_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(back[i], their_back[i]) << "value " << i;
    // The values are divided by the exact step max|x| / 127 and rounded, then multiplied by the
    // step rounded to float16: within half a step plus 127 times the step's rounding.
    float amax = 0.0f;
    for (size_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(values[j]));
    const double step = amax / 127.0, stored = f16_to_f32(ours[i / 32].d);
    EXPECT_LE(std::fabs(back[i] - values[i]), step / 2 + 127 * std::fabs(stored - step) + 1e-12 * step) << "value " << i;
  }
}

// Super-blocks of 256 of every kind the Q4_K quantizer can get wrong: Gaussian values at several
// scales, an all-zero super-block, only positive values (the minimum pinned to 0), a constant
// sub-block, a single outlier, and tiny and huge values.
std::vector<float> awkward_super_blocks() {
  Rng rng(testing::test_seed());
  std::vector<float> values;
  for (double scale : {1.0, 0.02, 1e-3, 300.0}) {
    for (int i = 0; i < 256 * 12; ++i) values.push_back(static_cast<float>(rng.normal() * scale));
  }
  values.insert(values.end(), 256, 0.0f);
  for (int i = 0; i < 256; ++i) values.push_back(static_cast<float>(std::fabs(rng.normal())) + 0.5f);
  for (int i = 0; i < 256; ++i) values.push_back(i < 32 ? 0.75f : static_cast<float>(rng.normal()));
  for (int i = 0; i < 256; ++i) values.push_back(i == 77 ? -40.0f : static_cast<float>(rng.normal() * 0.1));
  for (int i = 0; i < 256; ++i) values.push_back(1e-6f * static_cast<float>(rng.normal()));
  for (int i = 0; i < 256; ++i) values.push_back(static_cast<float>(rng.normal() * 2e4));
  return values;
}

TEST(Quantized, Q4_KValuesAreGgmlsAndOnTheNearestPointOfTheirGrid) {
  testing::TempDir dir;
  const std::vector<float> values = awkward_super_blocks();
  const auto count = static_cast<int64_t>(values.size());
  std::vector<BlockQ4_K> ours(values.size() / 256);
  quantize_q4_k(values.data(), ours.data(), count);
  std::vector<float> back(values.size());
  dequantize_q4_k(ours.data(), back.data(), count);
  write_raw(dir.path() / "ours.bin", ours);
  ASSERT_TRUE(run_gguf_quants("dequantize", "q4_k", dir.path() / "ours.bin", dir.path() / "back.f32"));
  const std::vector<float> their_back = read_raw<float>(dir.path() / "back.f32");
  ASSERT_EQ(their_back.size(), back.size());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], their_back[i]) << "value " << i;

  // Each sub-block's grid is {d * scale * l - dmin * min : l = 0..15}, from the block's bytes
  // read by hand (sub-block j < 4: scale = scales[j] & 63, min = scales[j + 4] & 63; j >= 4: low
  // bits from scales[j + 4], top two from scales[j - 4] and scales[j]).
  double squared_error = 0, squared_values = 0;
  for (size_t b = 0; b < ours.size(); ++b) {
    const BlockQ4_K& block = ours[b];
    const uint8_t* s = block.scales;
    for (int j = 0; j < 8; ++j) {
      const int scale = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      const int min = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      const double step = static_cast<double>(f16_to_f32(block.d)) * scale, low = -static_cast<double>(f16_to_f32(block.dmin)) * min;
      for (int i = 0; i < 32; ++i) {
        const size_t at = b * 256 + static_cast<size_t>(j) * 32 + static_cast<size_t>(i);
        const double x = values[at];
        squared_error += (back[at] - x) * (back[at] - x);
        squared_values += x * x;
        if (step == 0) continue;  // a constant (or zero) sub-block: every value the minimum
        // The level the value rounds to on the grid, clamped to 0..15; ties may go either way
        // (float rounding of (x + min) / step), so allow half a step plus its rounding.
        const double level = std::clamp(std::nearbyint((x - low) / step), 0.0, 15.0);
        const double nearest = step * level + low;
        ASSERT_LE(std::fabs(back[at] - nearest), 1e-6 * (std::fabs(nearest) + step)) << "value " << at;
      }
      // The grid spans the sub-block: its values lie within a step of [low, low + 15 step] (the
      // scale and minimum rounded to 6 bits move the ends by at most half of the largest's 1/63).
      if (step == 0) continue;
      for (int i = 0; i < 32; ++i) {
        const double x = values[b * 256 + static_cast<size_t>(j) * 32 + static_cast<size_t>(i)];
        const double slack = step + (f16_to_f32(block.d) + f16_to_f32(block.dmin)) * 16.0;
        EXPECT_GE(x, low - slack) << "block " << b << " sub-block " << j;
        EXPECT_LE(x, low + 15 * step + slack) << "block " << b << " sub-block " << j;
      }
    }
  }
  // 4 bits over a Gaussian's range: an error well under a tenth of the values' RMS overall.
  EXPECT_LT(std::sqrt(squared_error / squared_values), 0.1);

}

TEST(Quantized, Q5_0BlocksAreGgmlsAndDequantizeToItsValues) {
  testing::TempDir dir;
  std::vector<float> values = awkward_values();
  for (int i = 0; i < 32; ++i) values.push_back(i == 3 ? 16.0f : static_cast<float>(i % 7) - 3.5f);  // d = -1: ties
  const auto count = static_cast<int64_t>(values.size());
  std::vector<BlockQ5_0> ours(values.size() / 32);
  quantize_q5_0(values.data(), ours.data(), count);
  write_raw(dir.path() / "values.f32", values);
  ASSERT_TRUE(run_gguf_quants("quantize", "q5_0", dir.path() / "values.f32", dir.path() / "theirs.bin"));
  const std::vector<uint8_t> theirs_bytes = read_raw<uint8_t>(dir.path() / "theirs.bin");
  ASSERT_EQ(theirs_bytes.size(), ours.size() * sizeof(BlockQ5_0));
  std::vector<BlockQ5_0> theirs(ours.size());
  std::memcpy(theirs.data(), theirs_bytes.data(), theirs_bytes.size());

  // The levels read back by hand: q = the nibble (low for weights 0-15, high for 16-31) plus
  // qh's bit i as the fifth bit.
  auto level = [](const BlockQ5_0& block, int i) {
    const uint32_t qh = block.qh[0] | (block.qh[1] << 8) | (block.qh[2] << 16) | (static_cast<uint32_t>(block.qh[3]) << 24);
    return ((i < 16 ? block.qs[i] & 0xF : block.qs[i - 16] >> 4) | static_cast<int>(((qh >> i) & 1) << 4));
  };
  std::vector<float> back(values.size());
  dequantize_q5_0(ours.data(), back.data(), count);
  for (size_t b = 0; b < ours.size(); ++b) {
    ASSERT_EQ(ours[b].d, theirs[b].d) << "block " << b;
    const float d = f16_to_f32(ours[b].d);
    for (int i = 0; i < 32; ++i) {
      const size_t at = b * 32 + static_cast<size_t>(i);
      const int q = level(ours[b], i);
      ASSERT_EQ(back[at], d * static_cast<float>(q - 16)) << "value " << at;
      if (q == level(theirs[b], i)) continue;
      // gguf multiplies x by 1 / d in float64: only where x / d + 16.5 lies within float
      // rounding of a whole number may the truncation go the other way.
      const double shifted = static_cast<double>(values[at]) / d + 16.5;
      EXPECT_LT(std::fabs(shifted - std::nearbyint(shifted)), 1e-3) << "value " << at;
      EXPECT_EQ(std::abs(q - level(theirs[b], i)), 1) << "value " << at;
    }
  }

  // Quantized again, the dequantized values come back as they are: a Q5_0 file read as float32
  // and quantized at load decodes as the file does.
  std::vector<BlockQ5_0> again(ours.size());
  quantize_q5_0(back.data(), again.data(), count);
  std::vector<float> back_again(values.size());
  dequantize_q5_0(again.data(), back_again.data(), count);
  EXPECT_EQ(back_again, back);

  // Dequantized: gguf's floats bit for bit.
  write_raw(dir.path() / "ours.bin", ours);
  ASSERT_TRUE(run_gguf_quants("dequantize", "q5_0", dir.path() / "ours.bin", dir.path() / "back.f32"));
  const std::vector<float> their_back = read_raw<float>(dir.path() / "back.f32");
  ASSERT_EQ(their_back.size(), back.size());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], their_back[i]) << "value " << i;
}

TEST(Quantized, Q4_KFallsBackToQ5_0AsLlamaCppDoesWhereRowsAreNotWholeSuperBlocks) {
  EXPECT_EQ(quantized_type_for_rows(DType::q4_k, 896), DType::q5_0);  // Qwen2.5-0.5B's hidden size
  EXPECT_EQ(quantized_type_for_rows(DType::q4_k, 4864), DType::q4_k);  // its MLP's: 19 super-blocks
  EXPECT_EQ(quantized_type_for_rows(DType::q8_0, 896), DType::q8_0);
  EXPECT_EQ(quantized_type_for_rows(DType::f32, 5), DType::f32);
}

TEST(Quantized, BlockTypesHaveBlockSizesAndRefuseBrokenBlocks) {
  EXPECT_TRUE(is_block_quantized(DType::q8_0));
  EXPECT_EQ(dtype_block_elements(DType::q8_0), 32);
  EXPECT_EQ(dtype_bytes(DType::q8_0, 64), 68u);
  EXPECT_EQ(dtype_bytes(DType::f32, 3), 12u);
  EXPECT_THROW(dtype_bytes(DType::q8_0, 40), Error);
  EXPECT_THROW(dtype_size(DType::q8_0), Error);
  EXPECT_EQ(parse_dtype("q8_0", "test"), DType::q8_0);
  std::vector<float> values(40, 1.0f);
  std::vector<BlockQ8_0> blocks(2);
  EXPECT_THROW(quantize_q8_0(values.data(), blocks.data(), 40), Error);
  EXPECT_TRUE(is_block_quantized(DType::q4_k));
  EXPECT_EQ(dtype_block_elements(DType::q4_k), 256);
  EXPECT_EQ(dtype_bytes(DType::q4_k, 512), 288u);
  EXPECT_THROW(dtype_bytes(DType::q4_k, 288), Error);
  EXPECT_EQ(parse_dtype("q4_k", "test"), DType::q4_k);
  std::vector<BlockQ4_K> super_blocks(1);
  EXPECT_THROW(quantize_blocks(DType::q4_k, values.data(), super_blocks.data(), 40), Error);
  EXPECT_THROW(quantize_blocks(DType::f32, values.data(), super_blocks.data(), 32), Error);
  EXPECT_TRUE(is_block_quantized(DType::q5_0));
  EXPECT_EQ(dtype_block_elements(DType::q5_0), 32);
  EXPECT_EQ(dtype_bytes(DType::q5_0, 64), 44u);
  EXPECT_EQ(parse_dtype("q5_0", "test"), DType::q5_0);
  std::vector<BlockQ5_0> q5_blocks(2);
  EXPECT_THROW(quantize_blocks(DType::q5_0, values.data(), q5_blocks.data(), 40), Error);
}

}  // namespace
}  // namespace paraflow
