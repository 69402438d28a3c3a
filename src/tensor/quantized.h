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
// - Q5_0: 32 weights per block, a float16 scale d and 5-bit values q (their low 4 bits in 16
//   bytes, weight i's in byte i % 16's low nibble for i < 16 and high nibble after; their top bits
//   in the 32-bit word qh, bit i): weight = d * (q - 16) (22 bytes, 5.5 bits per weight). The
//   quantizer is ggml's reference one (quantize_row_q5_0_ref): d = -m / 16 for the value m of
//   largest magnitude, q = min(31, trunc(x / d + 16.5)), bit for bit. llama.cpp writes it for Q4_K
//   matrices whose rows are not whole 256-weight super-blocks (quantized_type_for_rows).
// - Q8_K: the rows a Q4_K product multiplies, quantized as llama.cpp's q8_K (float d, 256 int8,
//   and the sums of each 16 of them, which the minimums multiply). Not a tensor type.
#pragma once

#include <cstdint>
#include <cstring>

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

struct BlockQ5_0 {
  static constexpr int64_t kElements = 32;
  uint16_t d;       // float16 bits
  uint8_t qh[4];    // bit i: the top bit of weight i's q (bytes, not a uint32_t: ggml's block is unaligned)
  uint8_t qs[16];   // byte i: weight i's low 4 bits in the low nibble, weight i + 16's in the high one
};
static_assert(sizeof(BlockQ5_0) == 22, "ggml's block_q5_0 is 22 bytes");

struct BlockQ8_K {
  static constexpr int64_t kElements = 256;
  float d;
  int8_t q[kElements];
  int16_t bsums[kElements / 16];  // the sum of each 16 consecutive q
};
static_assert(sizeof(BlockQ8_K) == 292, "llama.cpp's block_q8_K is 292 bytes");

// A Q4_K super-block's eight 6-bit scales and minimums, unpacked (inline: the products unpack
// each weight block's). Four bytes at a time: the low sub-blocks' are bytes 0-3 (scales) and 4-7
// (minimums) but their top 2 bits; the high ones' low 4 bits are the nibbles of bytes 8-11, their
// top 2 bits those top bits of bytes 0-7.
struct Q4_KScales {
  uint8_t scale[BlockQ4_K::kSubBlocks], min[BlockQ4_K::kSubBlocks];
};
inline Q4_KScales unpack_scales(const BlockQ4_K& block) {
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  uint32_t word[3];
  std::memcpy(word, block.scales, sizeof word);
  const uint32_t parts[4] = {word[0] & kLow6, (word[2] & kLow4) | (((word[0] >> 6) & kLow2) << 4), word[1] & kLow6,
                             ((word[2] >> 4) & kLow4) | (((word[1] >> 6) & kLow2) << 4)};
  Q4_KScales out;
  std::memcpy(out.scale, parts, 8);
  std::memcpy(out.min, parts + 2, 8);
  return out;
}

// `count` values (a multiple of the block's elements) into count / kElements blocks, and back.
void quantize_q8_0(const float* values, BlockQ8_0* blocks, int64_t count);
void dequantize_q8_0(const BlockQ8_0* blocks, float* values, int64_t count);
void quantize_q4_k(const float* values, BlockQ4_K* blocks, int64_t count);
void dequantize_q4_k(const BlockQ4_K* blocks, float* values, int64_t count);
void quantize_q5_0(const float* values, BlockQ5_0* blocks, int64_t count);
void dequantize_q5_0(const BlockQ5_0* blocks, float* values, int64_t count);
void quantize_q8_k(const float* values, BlockQ8_K* blocks, int64_t count);
void dequantize_q8_k(const BlockQ8_K* blocks, float* values, int64_t count);

// The two above for a block-quantized tensor type (is_block_quantized), `blocks` its bytes.
void quantize_blocks(DType dtype, const float* values, void* blocks, int64_t count);
void dequantize_blocks(DType dtype, const void* blocks, float* values, int64_t count);
// `count` values stored as `dtype` (f32, f16, bf16 or block-quantized; for blocks a whole number
// of them) as float32.
void stored_values_as_f32(DType dtype, const void* bytes, float* values, int64_t count);

// The type a matrix whose rows hold `columns` values is quantized to when `requested` is asked
// for: llama.cpp's fallback (llama-quant.cpp's tensor_type_fallback) where a K-quant's 256-value
// super-blocks do not divide the rows, Q4_K -> Q5_0 (Qwen2.5-0.5B's rows of 896); else `requested`.
DType quantized_type_for_rows(DType requested, int64_t columns);

}  // namespace paraflow
