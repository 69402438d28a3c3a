#include "tensor/quantized.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"

namespace paraflow {

namespace {

void check_whole_blocks(int64_t count, int64_t block, const char* type) {
  if (count % block != 0) throw Error(fmt::format("{}: {} values are not a whole number of {}-value blocks", type, count, block));
}

// ggml's rounding in its K-quant quantizers: to nearest, ties to even.
int nearest(float value) { return static_cast<int>(std::nearbyint(value)); }

// A Q4_K sub-block's fit: value ~ scale * level - min, levels 0..15.
struct SubBlockFit {
  float scale = 0, min = 0;
};

// The levels of 32 values and the scale and minimum that minimize sum(weight * error^2): the
// grid from the values' minimum (at most 0) to their maximum in 15 steps first, then 21 grids of
// 14..16 steps, each refit by weighted least squares (a minimum that would come out positive
// pinned to 0), the best kept. Each grid starts at the best fit's minimum so far, not the
// values' own: ggml's make_qkx2_quants does so (its `min` is both), and we follow it to give
// llama.cpp's blocks byte for byte, with its Q4_K settings, in the same float arithmetic.
SubBlockFit fit_sub_block(const float* x, const float* weights, uint8_t* levels) {
  constexpr int kSteps = 15, kSubElements = BlockQ4_K::kSubElements;
  float low = x[0], high = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < kSubElements; ++i) {
    low = std::min(low, x[i]);
    high = std::max(high, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  low = std::min(low, 0.0f);
  if (high == low) {
    std::fill(levels, levels + kSubElements, 0);
    return {0.0f, -low};
  }
  float offset = low;  // the fit's additive term (-min), and the grids' start
  auto level = [&](float inverse, int i) { return static_cast<uint8_t>(std::clamp(nearest(inverse * (x[i] - offset)), 0, kSteps)); };
  const float first_inverse = kSteps / (high - low);
  float scale = 1 / first_inverse, best_error = 0;
  for (int i = 0; i < kSubElements; ++i) {
    levels[i] = level(first_inverse, i);
    const float diff = scale * levels[i] + low - x[i];
    best_error += weights[i] * (diff * diff);
  }
  uint8_t candidate[kSubElements];
  for (int step = 0; step <= 20; ++step) {
    const float inverse = (-1.0f + 0.1f * step + kSteps) / (high - offset);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < kSubElements; ++i) {
      candidate[i] = level(inverse, i);
      const float w = weights[i], l = candidate[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det, this_offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_offset > 0) {
      this_offset = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < kSubElements; ++i) {
      const float diff = this_scale * candidate[i] + this_offset - x[i];
      error += weights[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(candidate, candidate + kSubElements, levels);
      best_error = error;
      scale = this_scale;
      offset = this_offset;
    }
  }
  return {scale, -offset};
}

// Packs sub-block j's 6-bit scale and minimum (see BlockQ4_K::scales); `scales` starts zeroed.
void pack_scale(uint8_t* scales, int j, uint8_t scale, uint8_t min) {
  if (j < 4) {
    scales[j] = scale;
    scales[j + 4] = min;
  } else {
    scales[j + 4] = static_cast<uint8_t>((scale & 0xF) | ((min & 0xF) << 4));
    scales[j - 4] |= static_cast<uint8_t>((scale >> 4) << 6);
    scales[j] |= static_cast<uint8_t>((min >> 4) << 6);
  }
}

}  // namespace

void quantize_q8_0(const float* values, BlockQ8_0* blocks, int64_t count) {
  check_whole_blocks(count, BlockQ8_0::kElements, "q8_0");
  for (int64_t b = 0; b < count / BlockQ8_0::kElements; ++b) {
    const float* x = values + b * BlockQ8_0::kElements;
    float amax = 0.0f;
    for (int64_t i = 0; i < BlockQ8_0::kElements; ++i) amax = std::max(amax, std::fabs(x[i]));
    // ggml divides by d in float, not by its float16 rounding, and rounds halves away from zero.
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    for (int64_t i = 0; i < BlockQ8_0::kElements; ++i) blocks[b].q[i] = static_cast<int8_t>(std::round(x[i] * inverse));
  }
}

void dequantize_q8_0(const BlockQ8_0* blocks, float* values, int64_t count) {
  check_whole_blocks(count, BlockQ8_0::kElements, "q8_0");
  for (int64_t b = 0; b < count / BlockQ8_0::kElements; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int64_t i = 0; i < BlockQ8_0::kElements; ++i) values[b * BlockQ8_0::kElements + i] = d * blocks[b].q[i];
  }
}

void quantize_q4_k(const float* values, BlockQ4_K* blocks, int64_t count) {
  check_whole_blocks(count, BlockQ4_K::kElements, "q4_k");
  constexpr int kSub = BlockQ4_K::kSubBlocks, kSubElements = BlockQ4_K::kSubElements;
  for (int64_t b = 0; b < count / BlockQ4_K::kElements; ++b) {
    const float* x = values + b * BlockQ4_K::kElements;
    BlockQ4_K& block = blocks[b];
    uint8_t levels[BlockQ4_K::kElements];
    SubBlockFit fits[kSub];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < kSub; ++j) {
      // Each value weighted by its sub-block's RMS plus its own magnitude: large values count more.
      const float* sub = x + j * kSubElements;
      float sum_x2 = 0, weights[kSubElements];
      for (int i = 0; i < kSubElements; ++i) sum_x2 += sub[i] * sub[i];
      const float rms = std::sqrt(sum_x2 / kSubElements);
      for (int i = 0; i < kSubElements; ++i) weights[i] = rms + std::fabs(sub[i]);
      fits[j] = fit_sub_block(sub, weights, levels + j * kSubElements);
      max_scale = std::max(max_scale, fits[j].scale);
      max_min = std::max(max_min, fits[j].min);
    }
    // The scales and minimums in 6 bits against the largest of each; the levels then refit to
    // the scales as stored.
    const float inverse_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inverse_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    std::memset(block.scales, 0, sizeof block.scales);
    for (int j = 0; j < kSub; ++j) {
      const auto scale = static_cast<uint8_t>(std::min(63, nearest(inverse_scale * fits[j].scale)));
      const auto min = static_cast<uint8_t>(std::min(63, nearest(inverse_min * fits[j].min)));
      pack_scale(block.scales, j, scale, min);
    }
    block.d = f32_to_f16(max_scale / 63.0f);
    block.dmin = f32_to_f16(max_min / 63.0f);
    const Q4_KScales stored = unpack_scales(block);
    for (int j = 0; j < kSub; ++j) {
      const float d = f16_to_f32(block.d) * stored.scale[j];
      if (d == 0) continue;  // the fit's levels stay
      const float dm = f16_to_f32(block.dmin) * stored.min[j];
      for (int i = 0; i < kSubElements; ++i) {
        levels[j * kSubElements + i] = static_cast<uint8_t>(std::clamp(nearest((x[j * kSubElements + i] + dm) / d), 0, 15));
      }
    }
    for (int half = 0; half < 4; ++half) {
      for (int i = 0; i < 32; ++i) {
        block.qs[half * 32 + i] = static_cast<uint8_t>(levels[half * 64 + i] | (levels[half * 64 + 32 + i] << 4));
      }
    }
  }
}

void dequantize_q4_k(const BlockQ4_K* blocks, float* values, int64_t count) {
  check_whole_blocks(count, BlockQ4_K::kElements, "q4_k");
  for (int64_t b = 0; b < count / BlockQ4_K::kElements; ++b) {
    const BlockQ4_K& block = blocks[b];
    const Q4_KScales s = unpack_scales(block);
    const float d = f16_to_f32(block.d), dmin = f16_to_f32(block.dmin);
    float* y = values + b * BlockQ4_K::kElements;
    for (int j = 0; j < BlockQ4_K::kSubBlocks; ++j) {
      const float scale = d * s.scale[j], min = dmin * s.min[j];
      const uint8_t* q = block.qs + (j / 2) * 32;
      const int shift = (j % 2) * 4;
      for (int i = 0; i < 32; ++i) y[j * 32 + i] = scale * ((q[i] >> shift) & 0xF) - min;
    }
  }
}

void quantize_q5_0(const float* values, BlockQ5_0* blocks, int64_t count) {
  check_whole_blocks(count, BlockQ5_0::kElements, "q5_0");
  for (int64_t b = 0; b < count / BlockQ5_0::kElements; ++b) {
    const float* x = values + b * BlockQ5_0::kElements;
    float amax = 0.0f, max = 0.0f;  // the first value of largest magnitude, signed
    for (int64_t i = 0; i < BlockQ5_0::kElements; ++i) {
      if (amax < std::fabs(x[i])) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    // That value maps to q = 0 (-16 d): the signed extreme gets the level the other side lacks.
    const float d = max / -16;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    uint32_t qh = 0;
    for (int64_t i = 0; i < 16; ++i) {
      // x / d + 16.5 is at least 0.5: the cast truncates as ggml's does.
      const int low = std::min(31, static_cast<int>(x[i] * inverse + 16.5f));
      const int high = std::min(31, static_cast<int>(x[i + 16] * inverse + 16.5f));
      blocks[b].qs[i] = static_cast<uint8_t>((low & 0xF) | ((high & 0xF) << 4));
      qh |= static_cast<uint32_t>(low >> 4) << i;
      qh |= static_cast<uint32_t>(high >> 4) << (i + 16);
    }
    std::memcpy(blocks[b].qh, &qh, sizeof qh);
  }
}

void dequantize_q5_0(const BlockQ5_0* blocks, float* values, int64_t count) {
  check_whole_blocks(count, BlockQ5_0::kElements, "q5_0");
  for (int64_t b = 0; b < count / BlockQ5_0::kElements; ++b) {
    const BlockQ5_0& block = blocks[b];
    const float d = f16_to_f32(block.d);
    uint32_t qh;
    std::memcpy(&qh, block.qh, sizeof qh);
    float* y = values + b * BlockQ5_0::kElements;
    for (int i = 0; i < 16; ++i) {
      const int low = (block.qs[i] & 0xF) | static_cast<int>(((qh >> i) & 1) << 4);
      const int high = (block.qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1) << 4);
      y[i] = d * static_cast<float>(low - 16);
      y[i + 16] = d * static_cast<float>(high - 16);
    }
  }
}

void quantize_q8_k(const float* values, BlockQ8_K* blocks, int64_t count) {
  check_whole_blocks(count, BlockQ8_K::kElements, "q8_k");
  for (int64_t b = 0; b < count / BlockQ8_K::kElements; ++b) {
    const float* x = values + b * BlockQ8_K::kElements;
    BlockQ8_K& block = blocks[b];
    float amax = 0.0f;
    for (int64_t i = 0; i < BlockQ8_K::kElements; ++i) amax = std::max(amax, std::fabs(x[i]));
    block.d = amax / 127.0f;
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < BlockQ8_K::kElements; ++i) block.q[i] = static_cast<int8_t>(std::clamp(nearest(x[i] * inverse), -127, 127));
    for (int64_t g = 0; g < BlockQ8_K::kElements / 16; ++g) {
      int sum = 0;
      for (int64_t i = 0; i < 16; ++i) sum += block.q[g * 16 + i];
      block.bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

void dequantize_q8_k(const BlockQ8_K* blocks, float* values, int64_t count) {
  check_whole_blocks(count, BlockQ8_K::kElements, "q8_k");
  for (int64_t b = 0; b < count / BlockQ8_K::kElements; ++b) {
    for (int64_t i = 0; i < BlockQ8_K::kElements; ++i) values[b * BlockQ8_K::kElements + i] = blocks[b].d * blocks[b].q[i];
  }
}

void quantize_blocks(DType dtype, const float* values, void* blocks, int64_t count) {
  switch (dtype) {
    case DType::q8_0: quantize_q8_0(values, static_cast<BlockQ8_0*>(blocks), count); return;
    case DType::q4_k: quantize_q4_k(values, static_cast<BlockQ4_K*>(blocks), count); return;
    case DType::q5_0: quantize_q5_0(values, static_cast<BlockQ5_0*>(blocks), count); return;
    default: fail("quantize_blocks: {} is not block-quantized", dtype_name(dtype));
  }
}

void dequantize_blocks(DType dtype, const void* blocks, float* values, int64_t count) {
  switch (dtype) {
    case DType::q8_0: dequantize_q8_0(static_cast<const BlockQ8_0*>(blocks), values, count); return;
    case DType::q4_k: dequantize_q4_k(static_cast<const BlockQ4_K*>(blocks), values, count); return;
    case DType::q5_0: dequantize_q5_0(static_cast<const BlockQ5_0*>(blocks), values, count); return;
    default: fail("dequantize_blocks: {} is not block-quantized", dtype_name(dtype));
  }
}

void stored_values_as_f32(DType dtype, const void* bytes, float* values, int64_t count) {
  const auto* bits = static_cast<const uint16_t*>(bytes);
  switch (dtype) {
    case DType::f32: std::memcpy(values, bytes, static_cast<size_t>(count) * sizeof(float)); return;
    case DType::f16:
      for (int64_t i = 0; i < count; ++i) values[i] = f16_to_f32(bits[i]);
      return;
    case DType::bf16:
      for (int64_t i = 0; i < count; ++i) values[i] = bf16_to_f32(bits[i]);
      return;
    default: dequantize_blocks(dtype, bytes, values, count);
  }
}

DType quantized_type_for_rows(DType requested, int64_t columns) {
  if (requested == DType::q4_k && columns % BlockQ4_K::kElements != 0) return DType::q5_0;
  return requested;
}

}  // namespace paraflow
