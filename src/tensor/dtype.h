// Element types and their conversions. 16-bit floats are stored as raw bits (uint16_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace paraflow {

// q8_0, q4_k and q5_0 are block-quantized, with ggml's byte layouts (tensor/quantized.h): elements come
// in blocks of dtype_block_elements, each stored in dtype_block_bytes, so a tensor's byte count is
// dtype_bytes, not a per-element size times the count.
enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u16, q8_0, q4_k, q5_0 };

bool is_block_quantized(DType dtype);
// Elements per block: 1 for the element types.
int64_t dtype_block_elements(DType dtype);
// Bytes per block (per element for the element types).
size_t dtype_block_bytes(DType dtype);
// The bytes of `count` elements; fails (Error) when count is not a whole number of blocks.
size_t dtype_bytes(DType dtype, int64_t count);
// An element type's size; fails (Error) for a block-quantized type, which has none.
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses our names ("f32", "q8_0") and safetensors' ("F32"); throws InputError naming `context`.
DType parse_dtype(const std::string& name, const std::string& context);
// The safetensors spelling: F32, BF16, ... (null for a block-quantized type: safetensors has none).
const char* safetensors_dtype_name(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  if ((word & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((word >> 16) | 0x40u);
  word += 0x7FFFu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

float f16_to_f32_portable(uint16_t bits);
uint16_t f32_to_f16_portable(float value);

// IEEE half precision, round to nearest even, overflow to inf; the CPU's F16C instructions when
// it has them.
inline float f16_to_f32(uint16_t bits) {
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return f16_to_f32_portable(bits);
#endif
}

inline uint16_t f32_to_f16(float value) {
#if defined(__F16C__)
  return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT);
#else
  return f32_to_f16_portable(value);
#endif
}

}  // namespace paraflow
