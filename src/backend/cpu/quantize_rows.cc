#include "backend/cpu/quantize_rows.h"

#include <immintrin.h>

namespace paraflow::cpu {

#ifdef __AVX512F__
// GCC 12 takes the 512-bit intrinsics' undefined pass-through operands for uninitialized reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace {

// 16 values times `inverse`, rounded half away from zero as std::round does: the truncation plus
// the sign where the fraction (exact: the value less its truncation) is at least a half.
inline __m512i round_half_away(__m512 values, float inverse) {
  const __m512 scaled = _mm512_mul_ps(values, _mm512_set1_ps(inverse));
  const __m512 whole = _mm512_roundscale_ps(scaled, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 fraction = _mm512_abs_ps(_mm512_sub_ps(scaled, whole));
  const __mmask16 away = _mm512_cmp_ps_mask(fraction, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 sign_one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(scaled, _mm512_set1_ps(-0.0f)));
  return _mm512_cvtps_epi32(_mm512_mask_add_ps(whole, away, whole, sign_one));
}

// 16 values times `inverse`, rounded to nearest with ties to even (nearbyint), clamped to +-127.
inline __m512i round_to_even(__m512 values, float inverse) {
  const __m512i rounded = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(values, _mm512_set1_ps(inverse)),
                                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return _mm512_max_epi32(_mm512_min_epi32(rounded, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
}

}  // namespace

void quantize_rows_q8_0(const float* values, BlockQ8_0* blocks, int64_t count) {
  for (int64_t b = 0; b < count / BlockQ8_0::kElements; ++b) {
    const float* x = values + b * BlockQ8_0::kElements;
    const __m512 low = _mm512_loadu_ps(x), high = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blocks[b].q), _mm512_cvtepi32_epi8(round_half_away(low, inverse)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blocks[b].q + 16), _mm512_cvtepi32_epi8(round_half_away(high, inverse)));
  }
}

void quantize_rows_q8_k(const float* values, BlockQ8_K* blocks, int64_t count) {
  constexpr int kVectors = BlockQ8_K::kElements / 16;
  for (int64_t b = 0; b < count / BlockQ8_K::kElements; ++b) {
    const float* x = values + b * BlockQ8_K::kElements;
    BlockQ8_K& block = blocks[b];
    __m512 magnitudes = _mm512_setzero_ps();
    for (int v = 0; v < kVectors; ++v) magnitudes = _mm512_max_ps(magnitudes, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * v)));
    const float amax = _mm512_reduce_max_ps(magnitudes);
    block.d = amax / 127.0f;
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int v = 0; v < kVectors; ++v) {
      const __m512i levels = round_to_even(_mm512_loadu_ps(x + 16 * v), inverse);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(block.q + 16 * v), _mm512_cvtepi32_epi8(levels));
      block.bsums[v] = static_cast<int16_t>(_mm512_reduce_add_epi32(levels));
    }
  }
}
#pragma GCC diagnostic pop
#else
void quantize_rows_q8_0(const float* values, BlockQ8_0* blocks, int64_t count) { quantize_q8_0(values, blocks, count); }
void quantize_rows_q8_k(const float* values, BlockQ8_K* blocks, int64_t count) { quantize_q8_k(values, blocks, count); }
#endif

}  // namespace paraflow::cpu
