// AVX2 loads shared by the kernels that read f32 or bf16 operands: eight of either, as f32 lanes
// (bf16 widened in registers, so bf16 operands move half the bytes).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "backend/cpu/storage.h"

namespace paraflow::cpu {

inline __m256 load8(const float* from) { return _mm256_loadu_ps(from); }
inline __m256 load8(const BFloat16* from) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

}  // namespace paraflow::cpu
#endif
