#include "tensor/quantized.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "tensor/dtype.h"

namespace paraflow {

namespace {

void check_whole_blocks(int64_t count, int64_t block, const char* type) {
  if (count % block != 0) throw Error(fmt::format("{}: {} values are not a whole number of {}-value blocks", type, count, block));
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

}  // namespace paraflow
