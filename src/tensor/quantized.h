// Block-quantized weights in ggml's byte layouts, so that a GGUF file's tensor data is these
// blocks as they are. Q8_0: 32 weights per block, one float16 scale d and 32 int8 values q,
// weight = d * q (34 bytes, 8.5 bits per weight). The quantizer is ggml's reference one
// (quantize_row_q8_0_ref): d = max|x| / 127, q = round-half-away(x / d), bit for bit.
#pragma once

#include <cstdint>

namespace paraflow {

struct BlockQ8_0 {
  static constexpr int64_t kElements = 32;
  uint16_t d;  // float16 bits
  int8_t q[kElements];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml's block_q8_0 is 34 bytes");

// `count` values (a multiple of 32) into count / 32 blocks, and back.
void quantize_q8_0(const float* values, BlockQ8_0* blocks, int64_t count);
void dequantize_q8_0(const BlockQ8_0* blocks, float* values, int64_t count);

}  // namespace paraflow
