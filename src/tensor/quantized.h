// Block-quantized weights in ggml's byte layouts, so that a GGUF file's tensor data is these
// blocks as they are.
// - Q8_0: 32 weights per block, one float16 scale d and 32 int8 values q, weight = d * q (34 bytes,
//   8.5 bits per weight). The quantizer is ggml's reference one (quantize_row_q8_0_ref): d =
//   max|x| / 127, q = round-half-away(x / d), bit for bit.
// - Q4_K: 256 weights per super-block of 8 sub-blocks of 32; a float16 d and dmin, each sub-block's
//   6-bit scale s and 6-bit minimum m packed into 12 bytes, and 4-bit values q: weight = d * s * q -
//   dmin * m (144 bytes, 4.5 bits per weight). The quantizer follows ggml's reference algorithm
//   (quantize_row_q4_K_ref): per sub-block the scale and minimum that minimize a weighted squared
//   error over a few candidate grids, then those quantized to 6 bits against the largest.
// - Q8_K: the rows a Q4_K product multiplies, quantized as llama.cpp's q8_K (float d, 256 int8,
//   and the sums of each 16 of them, which the minimums multiply). Not a tensor type.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace paraflow {

struct BlockQ8_0 {
  static constexpr int64_t kElements = 32;
  uint16_t d;  // float16 bits
  int8_t q[kElements];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml's block_q8_0 is 34 bytes");

struct BlockQ4_K {
  static constexpr int64_t kElements = 256, kSubBlocks = 8, kSubElements = 32;
  uint16_t d, dmin;     // float16 bits: the scales of the 6-bit scales and of the 6-bit minimums
  uint8_t scales[12];   // sub-block j < 4: scale scales[j] & 63, minimum scales[j + 4] & 63; j >= 4:
                        // low 4 bits in scales[j + 4] (scale low, minimum high nibble), top 2 bits
                        // in the top bits of scales[j - 4] (scale) and scales[j] (minimum)
  uint8_t qs[128];      // 64 weights per 32 bytes: sub-block 2i in the low nibbles, 2i + 1 the high
};
static_assert(sizeof(BlockQ4_K) == 144, "ggml's block_q4_K is 144 bytes");

struct BlockQ8_K {
  static constexpr int64_t kElements = 256;
  float d;
  int8_t q[kElements];
  int16_t bsums[kElements / 16];  // the sum of each 16 consecutive q
};
static_assert(sizeof(BlockQ8_K) == 292, "llama.cpp's block_q8_K is 292 bytes");

// A Q4_K super-block's eight 6-bit scales and minimums, unpacked (inline: the products unpack
// each weight block's).
struct Q4_KScales {
  uint8_t scale[BlockQ4_K::kSubBlocks], min[BlockQ4_K::kSubBlocks];
};
inline Q4_KScales unpack_scales(const BlockQ4_K& block) {
  Q4_KScales out;
  const uint8_t* s = block.scales;
  for (int j = 0; j < 4; ++j) {
    out.scale[j] = s[j] & 63;
    out.min[j] = s[j + 4] & 63;
    out.scale[j + 4] = static_cast<uint8_t>((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
    out.min[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
  return out;
}

// `count` values (a multiple of the block's elements) into count / kElements blocks, and back.
void quantize_q8_0(const float* values, BlockQ8_0* blocks, int64_t count);
void dequantize_q8_0(const BlockQ8_0* blocks, float* values, int64_t count);
void quantize_q4_k(const float* values, BlockQ4_K* blocks, int64_t count);
void dequantize_q4_k(const BlockQ4_K* blocks, float* values, int64_t count);
void quantize_q8_k(const float* values, BlockQ8_K* blocks, int64_t count);
void dequantize_q8_k(const BlockQ8_K* blocks, float* values, int64_t count);

// The two above for a block-quantized tensor type (is_block_quantized), `blocks` its bytes.
void quantize_blocks(DType dtype, const float* values, void* blocks, int64_t count);
void dequantize_blocks(DType dtype, const void* blocks, float* values, int64_t count);

}  // namespace paraflow
