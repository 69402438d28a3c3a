// Element types a memory-bound kernel can read and write directly: float, or the 16-bit
// bfloat16 / float16 of the mixed-precision policies (converted to float in registers, so the
// kernel moves half the bytes). Kernels are templates over these types, registered per dtype.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace paraflow::cpu {

struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

inline float to_float(float value) { return value; }
inline float to_float(BFloat16 value) { return bf16_to_f32(value.bits); }
inline float to_float(Float16 value) { return f16_to_f32(value.bits); }

template <typename T>
inline T from_float(float value);
template <>
inline float from_float<float>(float value) { return value; }
template <>
inline BFloat16 from_float<BFloat16>(float value) { return {f32_to_bf16(value)}; }
template <>
inline Float16 from_float<Float16>(float value) { return {f32_to_f16(value)}; }

}  // namespace paraflow::cpu
