#include "backend/cpu/q4_k_products.h"

#include <immintrin.h>

#include <vector>

#include "backend/cpu/avx2.h"
#include "backend/cpu/row_blocks.h"
#include "backend/quantized_tiles.h"
#include "base/error.h"

namespace paraflow::cpu {

namespace {

#if defined(__AVX2__) && defined(__FMA__)
// Eight int32 lanes summing to sum_j scale_j * (q4_j . q8_j) over one super-block pair. The
// nibbles (0..15) are the unsigned operand of vpmaddubsw, x's int8 the signed one: pairs summed in
// int16 (at most 2 * 15 * 127, no saturation), then times the sub-block's scale and pairs summed
// into int32 (AVX512_VNNI's or AVX_VNNI's vpdpwssd in one instruction, else vpmaddwd and an add).
// The scales are read from memory as int16, so that each broadcast is one load.
inline __m256i scaled_products(const BlockQ4_K& w, const BlockQ8_K& x, const int16_t* scales) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256i acc = _mm256_setzero_si256();
  auto add = [&acc](__m256i pairs, int16_t scale) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    acc = _mm256_dpwssd_epi32(acc, pairs, _mm256_set1_epi16(scale));
#elif defined(__AVXVNNI__)
    acc = _mm256_dpwssd_avx_epi32(acc, pairs, _mm256_set1_epi16(scale));
#else
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(scale)));
#endif
  };
#pragma GCC unroll 4
  for (int part = 0; part < 4; ++part) {  // 64 weights: sub-blocks 2 part (low nibbles) and 2 part + 1
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs + 32 * part));
    const __m256i low = _mm256_and_si256(packed, nibble), high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
    const __m256i x_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * part));
    const __m256i x_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * part + 32));
    add(_mm256_maddubs_epi16(low, x_low), scales[2 * part]);
    add(_mm256_maddubs_epi16(high, x_high), scales[2 * part + 1]);
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
    alignas(16) int16_t scales[BlockQ4_K::kSubBlocks];
    _mm_store_si128(reinterpret_cast<__m128i*>(scales), _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.scale))));
    const float d = f16_to_f32(wb.d), dmin = f16_to_f32(wb.dmin);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const BlockQ8_K& xb = x[r * blocks + b];
      const __m256 products = _mm256_cvtepi32_ps(scaled_products(wb, xb, scales));
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

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// GCC 12 takes the 512-bit conversions' undefined pass-through operand for an uninitialized read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// One super-block's d, dmin and unpacked scales and minimums for the 16 rows of a group, as the
// tile products read them: scales as int32 per row, minimums in int16 pairs (sub-blocks 2q and
// 2q + 1) per row.
struct TileHeads {
  __m512i scale[BlockQ4_K::kSubBlocks];
  __m512i min_pairs[BlockQ4_K::kSubBlocks / 2];
  __m512 d, dmin;
};

// unpack_scales on 16 rows at once: byte t of every row's packed scales is one 16-byte vector.
TileHeads unpack_tile_heads(const uint8_t* head) {
  TileHeads h;
  h.d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(head)));
  h.dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(head + 32)));
  __m128i bytes[12];
  for (int t = 0; t < 12; ++t) bytes[t] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(head + 64 + 16 * t));
  const __m128i low6 = _mm_set1_epi8(0x3F), low4 = _mm_set1_epi8(0x0F), low2 = _mm_set1_epi8(0x03);
  // The top 2 bits of each byte, moved to bits 4-5 (no bit crosses a byte: they are at most 3 before).
  auto top_two = [&](__m128i v) { return _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(v, 6), low2), 4); };
  __m128i mins[BlockQ4_K::kSubBlocks];
  for (int j = 0; j < 4; ++j) {
    h.scale[j] = _mm512_cvtepu8_epi32(_mm_and_si128(bytes[j], low6));
    mins[j] = _mm_and_si128(bytes[j + 4], low6);
  }
  for (int j = 4; j < 8; ++j) {
    h.scale[j] = _mm512_cvtepu8_epi32(_mm_or_si128(_mm_and_si128(bytes[j + 4], low4), top_two(bytes[j - 4])));
    mins[j] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(bytes[j + 4], 4), low4), top_two(bytes[j]));
  }
  for (int q = 0; q < 4; ++q) {
    const __m256i pairs = _mm256_set_m128i(_mm_unpackhi_epi8(mins[2 * q], mins[2 * q + 1]),
                                           _mm_unpacklo_epi8(mins[2 * q], mins[2 * q + 1]));
    h.min_pairs[q] = _mm512_cvtepu8_epi16(pairs);
  }
  return h;
}

// R input rows times one group of 16 weight rows stored out_in_tiles: per sub-block, each row's
// 16 int32 dot products from eight vpdpbusd of four input values broadcast against four nibbles
// of every weight row (the nibbles unpacked once for all R rows), times the sub-block's scales;
// the minimums' sums from four vpdpwssd of the row's sub-block sums in pairs; then two FMAs.
// Brings `next`'s lines into the caches on the way (row_blocks.h), a share at each sub-block.
template <int R>
void tile_block(float* sums, int64_t sums_ld, const BlockQ8_K* x, const int32_t* x_sum_pairs, int64_t blocks,
                const uint8_t* nibbles, const TileHeads* heads, const NextWeightsShare& next) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const TileHeads& h = heads[b];
    __m512i scaled[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) scaled[r] = _mm512_setzero_si512();
    for (int j = 0; j < BlockQ4_K::kSubBlocks; ++j) {  // sub-block j: part j / 2's low or high nibbles
      const int part = j / 2, shift = 4 * (j % 2);
      for (int64_t l = 0; l < next.lines_per_step; ++l) {
        _mm_prefetch(next.first_line + ((b * BlockQ4_K::kSubBlocks + j) * next.lines_per_step + l) * 64, _MM_HINT_T0);
      }
      __m512i dots[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dots[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const __m512i packed = _mm512_loadu_si512(nibbles + ((b * 4 + part) * 8 + s) * 64);
        const __m512i w = _mm512_and_si512(_mm512_srli_epi16(packed, shift), low4);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dots[r] = _mm512_dpbusd_epi32(dots[r], w, broadcast_four_bytes(x[r * blocks + b].q + 32 * j + 4 * s));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) scaled[r] = _mm512_add_epi32(scaled[r], _mm512_mullo_epi32(dots[r], h.scale[j]));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512i mins = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        mins = _mm512_dpwssd_epi32(mins, h.min_pairs[q], _mm512_set1_epi32(x_sum_pairs[(r * blocks + b) * 4 + q]));
      }
      const __m512 x_scale = _mm512_set1_ps(x[r * blocks + b].d);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled[r]), _mm512_mul_ps(x_scale, h.d), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(x_scale, h.dmin), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(sums + r * sums_ld, acc[r]);
}
#pragma GCC diagnostic pop
#endif

}  // namespace

Q4_KTileTerms q4_k_tile_terms(const BlockQ8_K* x, int64_t blocks) {
  thread_local std::vector<int32_t> sum_pairs;
  sum_pairs.resize(static_cast<size_t>(blocks * 4));
  for (int64_t i = 0; i < blocks; ++i) {
    for (int q = 0; q < 4; ++q) {
      const int16_t* sixteens = x[i].bsums + 4 * q;
      const auto first = static_cast<uint16_t>(sixteens[0] + sixteens[1]);
      const auto second = static_cast<uint16_t>(sixteens[2] + sixteens[3]);
      sum_pairs[static_cast<size_t>(i * 4 + q)] = static_cast<int32_t>(first | (uint32_t{second} << 16));
    }
  }
  return {sum_pairs.data()};
}

void q4_k_tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_K* x, const Q4_KTileTerms& terms, int64_t N,
                        int64_t C, const uint8_t* tiles, int64_t begin, int64_t end) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const int64_t blocks = C / BlockQ4_K::kElements;
  thread_local std::vector<TileHeads> heads;
  heads.resize(static_cast<size_t>(blocks));
  const size_t group_bytes = dtype_bytes(DType::q4_k, kQuantizedTileRows * C);
  for (int64_t o = begin; o < end; o += kQuantizedTileRows) {
    const uint8_t* group = tiles + static_cast<size_t>(o / kQuantizedTileRows) * group_bytes;
    const uint8_t* head_bytes = group + kQuantizedTileRows * blocks * 128;
    for (int64_t b = 0; b < blocks; ++b) heads[static_cast<size_t>(b)] = unpack_tile_heads(head_bytes + b * 256);
    const uint8_t* next = o + kQuantizedTileRows < end ? group + group_bytes : nullptr;
    int64_t row_block = 0;
    for_each_row_block(N, [&]<int R>(int64_t n) {
      tile_block<R>(sums + n * sums_ld + (o - begin), sums_ld, x + n * blocks, terms.sum_pairs + n * blocks * 4, blocks,
                    group, heads.data(),
                    next_weights_share(next, static_cast<int64_t>(group_bytes), N, row_block++,
                                       blocks * BlockQ4_K::kSubBlocks));
    });
  }
#else
  (void)sums, (void)sums_ld, (void)x, (void)terms, (void)N, (void)C, (void)tiles, (void)begin, (void)end;
  throw Error("q4_k_tile_dot_rows: this build has no AVX512_VNNI");
#endif
}

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
