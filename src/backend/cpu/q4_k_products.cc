#include "backend/cpu/q4_k_products.h"

#include <immintrin.h>

namespace paraflow::cpu {

namespace {

#if defined(__AVX2__) && defined(__FMA__)
// Eight int32 lanes summing to sum_j scale_j * (q4_j . q8_j) over one super-block pair. The
// nibbles (0..15) are the unsigned operand of vpdpbusd / vpmaddubsw, x's int8 the signed one.
inline __m256i scaled_products(const BlockQ4_K& w, const BlockQ8_K& x, const Q4_KScales& s) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int part = 0; part < 4; ++part) {  // 64 weights: sub-blocks 2 part (low nibbles) and 2 part + 1
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 32 * part));
    const __m256i low = _mm256_and_si256(packed, nibble), high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
    const __m256i x_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * part));
    const __m256i x_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * part + 32));
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i p_low = _mm256_dpbusd_epi32(_mm256_setzero_si256(), low, x_low);
    const __m256i p_high = _mm256_dpbusd_epi32(_mm256_setzero_si256(), high, x_high);
#else
    const __m256i p_low = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), low, x_low);
    const __m256i p_high = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), high, x_high);
#endif
    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p_low, _mm256_set1_epi32(s.scale[2 * part])));
    acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p_high, _mm256_set1_epi32(s.scale[2 * part + 1])));
#else
    // Pairs in int16 (at most 2 * 15 * 127: no saturation), then times the scale, pairs in int32.
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(low, x_low), _mm256_set1_epi16(s.scale[2 * part])));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(high, x_high), _mm256_set1_epi16(s.scale[2 * part + 1])));
#endif
  }
  return acc;
}

// Four int32 lanes summing to sum_j min_j * sum(q8_j): x's sums of 16 added in pairs, times the mins.
inline __m128i min_products(const BlockQ8_K& x, const Q4_KScales& s) {
  const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums + 8)));
  const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.min)));
  return _mm_madd_epi16(pairs, mins);
}

inline float horizontal_sum(__m256 v) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 halves = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(halves, _mm_movehdup_ps(halves)));
}

inline float horizontal_sum(__m128 v) {
  const __m128 halves = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(halves, _mm_movehdup_ps(halves)));
}

// R input rows times one weight row of `blocks` super-blocks. With `prefetch`, the weight row's
// blocks a few ahead are fetched meanwhile (one stream per thread, which the hardware prefetcher
// may not run far enough ahead of).
template <int R>
inline void dot_block(float* sums, int64_t sums_ld, const BlockQ8_K* x, const BlockQ4_K* w, int64_t blocks,
                      bool prefetch) {
  constexpr int kAhead = 4;
  __m256 acc[R];
  __m128 min_acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    min_acc[r] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (prefetch) {
      const char* ahead = reinterpret_cast<const char*>(w + b + kAhead);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
    }
    const BlockQ4_K& wb = w[b];
    const Q4_KScales s = unpack_scales(wb);
    const float d = f16_to_f32(wb.d), dmin = f16_to_f32(wb.dmin);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const BlockQ8_K& xb = x[r * blocks + b];
      const __m256 products = _mm256_cvtepi32_ps(scaled_products(wb, xb, s));
      acc[r] = _mm256_fmadd_ps(products, _mm256_set1_ps(xb.d * d), acc[r]);
      min_acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(min_products(xb, s)), _mm_set1_ps(xb.d * dmin), min_acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) sums[r * sums_ld] = horizontal_sum(acc[r]) - horizontal_sum(min_acc[r]);
}
#else
// Without AVX2: the same sums, one product at a time (int32 per super-block, f32 across them).
template <int R>
inline void dot_block(float* sums, int64_t sums_ld, const BlockQ8_K* x, const BlockQ4_K* w, int64_t blocks, bool) {
  for (int r = 0; r < R; ++r) {
    float sum = 0.0f, min_sum = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockQ4_K& wb = w[b];
      const BlockQ8_K& xb = x[r * blocks + b];
      const Q4_KScales s = unpack_scales(wb);
      int32_t products = 0, mins = 0;
      for (int j = 0; j < BlockQ4_K::kSubBlocks; ++j) {
        const uint8_t* q = wb.qs + (j / 2) * 32;
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += ((q[i] >> (4 * (j % 2))) & 0xF) * int32_t{xb.q[j * 32 + i]};
        products += s.scale[j] * dot;
        mins += s.min[j] * (xb.bsums[2 * j] + xb.bsums[2 * j + 1]);
      }
      sum += static_cast<float>(products) * (xb.d * f16_to_f32(wb.d));
      min_sum += static_cast<float>(mins) * (xb.d * f16_to_f32(wb.dmin));
    }
    sums[r * sums_ld] = sum - min_sum;
  }
}
#endif

}  // namespace

void q4_k_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_K* x, int64_t N, int64_t C, const BlockQ4_K* weight,
                   int64_t begin, int64_t end) {
  const int64_t blocks = C / BlockQ4_K::kElements;
  constexpr int kRows = 3;  // input rows per pass over a weight row: each weight block loaded once for three
  for (int64_t o = begin; o < end; ++o) {
    const BlockQ4_K* w = weight + o * blocks;
    float* out = sums + (o - begin);
    int64_t n = 0;
    for (; n + kRows <= N; n += kRows) dot_block<kRows>(out + n * sums_ld, sums_ld, x + n * blocks, w, blocks, n == 0);
    if (N - n == 2) dot_block<2>(out + n * sums_ld, sums_ld, x + n * blocks, w, blocks, n == 0);
    if (N - n == 1) dot_block<1>(out + n * sums_ld, sums_ld, x + n * blocks, w, blocks, n == 0);
  }
}

}  // namespace paraflow::cpu
