// Element types and their conversions. 16-bit floats are stored as raw bits (uint16_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace paraflow {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses our names ("f32") and safetensors' ("F32"); throws InputError naming `context`.
DType parse_dtype(const std::string& name, const std::string& context);
// The safetensors spelling: F32, BF16, ...
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

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

}  // namespace paraflow
