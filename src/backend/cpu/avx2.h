// AVX2 loads shared by the kernels that read f32, bf16 or float16 operands: eight of any (sixteen
// with AVX-512), as f32 lanes (16-bit values widened in registers, so they move half the bytes).
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
inline __m256 load8(const Float16* from) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from))); }
#ifdef __AVX512F__
inline __m512 load16(const float* from) { return _mm512_loadu_ps(from); }
// Sixteen bf16 values as f32 lanes. (The zero-masked forms: GCC 12's plain ones pass an
// _mm512_undefined_epi32() that it then warns "may be used uninitialized".)
inline __m512 load16(const BFloat16* from) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, bits), 16));
}
inline __m512 load16(const Float16* from) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)));
}
#endif

}  // namespace paraflow::cpu
#endif
