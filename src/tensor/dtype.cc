#include "tensor/dtype.h"

#include <cmath>

#include "base/error.h"
#include "tensor/quantized.h"

namespace paraflow {

bool is_block_quantized(DType dtype) { return dtype == DType::q8_0 || dtype == DType::q4_k || dtype == DType::q5_0; }

int64_t dtype_block_elements(DType dtype) {
  switch (dtype) {
    case DType::q8_0: return BlockQ8_0::kElements;
    case DType::q4_k: return BlockQ4_K::kElements;
    case DType::q5_0: return BlockQ5_0::kElements;
    default: return 1;
  }
}

size_t dtype_block_bytes(DType dtype) {
  switch (dtype) {
    case DType::q8_0: return sizeof(BlockQ8_0);
    case DType::q4_k: return sizeof(BlockQ4_K);
    case DType::q5_0: return sizeof(BlockQ5_0);
    default: return dtype_size(dtype);
  }
}

size_t dtype_bytes(DType dtype, int64_t count) {
  const int64_t block = dtype_block_elements(dtype);
  if (count % block != 0) {
    throw Error(fmt::format("{} elements of {} are not a whole number of its {}-element blocks", count,
                            dtype_name(dtype), block));
  }
  return static_cast<size_t>(count / block) * dtype_block_bytes(dtype);
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::q8_0:
    case DType::q4_k:
    case DType::q5_0: throw Error(fmt::format("{} is block-quantized: it has no per-element size", dtype_name(dtype)));
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u16: return "u16";
    case DType::q8_0: return "q8_0";
    case DType::q4_k: return "q4_k";
    case DType::q5_0: return "q5_0";
  }
  return "?";
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u16: return "U16";
    case DType::q8_0:
    case DType::q4_k:
    case DType::q5_0: return nullptr;
  }
  return "?";
}

DType parse_dtype(const std::string& name, const std::string& context) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u16, DType::q8_0,
                      DType::q4_k, DType::q5_0}) {
    const char* safetensors_name = safetensors_dtype_name(dtype);
    if (name == dtype_name(dtype) || (safetensors_name != nullptr && name == safetensors_name)) return dtype;
  }
  fail("{}: unsupported dtype '{}'", context, name);
}

float f16_to_f32_portable(uint16_t bits) {
  uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

uint16_t f32_to_f16_portable(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7E00u;
  if (magnitude >= 65520.0f) return sign | 0x7C00u;
  if (magnitude < 0x1.0p-14f) return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 0x1.0p24f));
  int exponent;
  float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent, fraction in [0.5,1)
  uint32_t mantissa = static_cast<uint32_t>(std::nearbyint((fraction * 2.0f - 1.0f) * 1024.0f));
  uint32_t biased = static_cast<uint32_t>(exponent - 1 + 15);
  return sign | static_cast<uint16_t>((biased << 10) + mantissa);  // a carry out of the mantissa bumps the exponent
}

}  // namespace paraflow
