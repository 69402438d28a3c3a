// AVX2 loads shared by the kernels that read f32, bf16 or float16 operands: eight of any (sixteen
// with AVX-512), as f32 lanes (16-bit values widened in registers, so they move half the bytes);
// with AVX-512 also the masks and lane sums of the kernels that read 32 16-bit values at a time.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

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
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)));
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
// Four consecutive bytes in every 32-bit lane: the four input values (int8) a vpdpbusd multiplies
// by four weights of each of 16 rows.
inline __m512i broadcast_four_bytes(const void* bytes) {
  int32_t word;
  std::memcpy(&word, bytes, sizeof word);
  return _mm512_set1_epi32(word);
}

// The mask of a chunk of 32 16-bit values starting at column c of a row of `columns`: all of them,
// or those left in the row.
inline __mmask32 mask_of_32(int64_t columns, int64_t c) {
  const int64_t left = columns - c;
  return left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << left) - 1);
}

// The lane sums of four vectors, added in _mm512_reduce_add_ps' order (each lane i < 8 plus lane
// i + 8, then i < 4 plus i + 4, then 0 + 2 and 1 + 3, then those two), four vectors at once: 14
// instructions instead of 36. Bit for bit its results, so that an output's sum does not depend on
// whether it was reduced as one of four.
inline __m128 sum_each(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 halves01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
                                        _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 halves23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(1, 0, 1, 0)),
                                        _mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(3, 2, 3, 2)));
  // Each 128-bit lane k: vector k's four partial sums.
  __m512 quarters = _mm512_add_ps(_mm512_shuffle_f32x4(halves01, halves23, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(halves01, halves23, _MM_SHUFFLE(3, 1, 3, 1)));
  quarters = _mm512_add_ps(quarters, _mm512_permute_ps(quarters, _MM_SHUFFLE(1, 0, 3, 2)));
  quarters = _mm512_add_ps(quarters, _mm512_permute_ps(quarters, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), quarters));
}
#endif

}  // namespace paraflow::cpu
#endif
