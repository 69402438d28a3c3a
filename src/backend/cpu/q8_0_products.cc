#include "backend/cpu/q8_0_products.h"

#include <immintrin.h>

#include <cstring>
#include <vector>

#include "backend/cpu/avx2.h"
#include "backend/cpu/row_blocks.h"
#include "backend/quantized_tiles.h"
#include "base/error.h"
#include "tensor/dtype.h"

namespace paraflow::cpu {

namespace {

#if defined(__AVX2__) && defined(__FMA__)
// A weight block's 32 values as signed bytes: Q8_0's as they are; Q5_0's q - 16 (ggml's way: a
// nibble whose top bit is clear is q - 16 = nibble - 16 = nibble | 0xF0 in two's complement, one
// whose top bit is set is the nibble itself).
inline __m256i signed_weights(const BlockQ8_0& w) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q)); }

inline __m256i signed_weights(const BlockQ5_0& w) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
  // qh's bit i into byte i: byte i of the broadcast word's byte i / 8, all bits but i % 8 set,
  // then all ones exactly where that bit is.
  uint32_t qh;
  std::memcpy(&qh, w.qh, sizeof qh);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(qh)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i top = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE)), _mm256_set1_epi8(-1));
  return _mm256_or_si256(nibbles, _mm256_andnot_si256(top, _mm256_set1_epi8(static_cast<char>(0xF0))));
}

// The eight int32 sums of one block pair's 32 int8 products, four products each. vpdpbusd and
// vpmaddubsw multiply unsigned by signed bytes: x's magnitudes times w with x's signs.
template <typename W>
inline __m256i block_products(const BlockQ8_0& x, const W& w) {
  const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q));
  const __m256i wq = signed_weights(w);
  const __m256i magnitudes = _mm256_sign_epi8(xq, xq), signed_w = _mm256_sign_epi8(wq, xq);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitudes, signed_w);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), magnitudes, signed_w);
#else
  // Pairs summed in int16 (at most 2 * 128 * 127: no saturation), then pairs of those in int32.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, signed_w), _mm256_set1_epi16(1));
#endif
}

inline float horizontal_sum(__m256 v) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 halves = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(halves, _mm_movehdup_ps(halves)));
}

// R input rows times K weight rows of `blocks` blocks: R x K independent accumulators. With
// `prefetch`, the blocks of the K weight rows after the next K are fetched meanwhile: the hardware
// prefetcher does not follow K interleaved streams, and the next K rows' blocks, fetched while
// these are multiplied, came too late (one thread on the GPT-2 124M shape, Zen 4: batch-1
// decoding 55 -> 146-206 tokens/s, decode_bench).
template <int R, int K, typename W>
inline void dot_block(float* sums, int64_t sums_ld, const BlockQ8_0* x, const W* w, int64_t blocks, bool prefetch) {
  __m256 acc[R][K];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) acc[r][k] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (prefetch) {
#pragma GCC unroll 4
      for (int k = 2 * K; k < 3 * K; ++k) _mm_prefetch(reinterpret_cast<const char*>(w + k * blocks + b), _MM_HINT_T0);
    }
    float w_scale[K];
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) w_scale[k] = f16_to_f32(w[k * blocks + b].d);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0& xb = x[r * blocks + b];
      const float x_scale = f16_to_f32(xb.d);
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        const __m256 products = _mm256_cvtepi32_ps(block_products(xb, w[k * blocks + b]));
        acc[r][k] = _mm256_fmadd_ps(products, _mm256_set1_ps(x_scale * w_scale[k]), acc[r][k]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) sums[r * sums_ld + k] = horizontal_sum(acc[r][k]);
  }
}
#else
// Without AVX2: the same sums, one product at a time (int32 per block, f32 across blocks).
inline int32_t weight_level(const BlockQ8_0& w, int i) { return w.q[i]; }

inline int32_t weight_level(const BlockQ5_0& w, int i) {
  uint32_t qh;
  std::memcpy(&qh, w.qh, sizeof qh);
  const int nibble = i < 16 ? w.qs[i] & 0xF : w.qs[i - 16] >> 4;
  return (nibble | static_cast<int>(((qh >> i) & 1) << 4)) - 16;
}

template <int R, int K, typename W>
inline void dot_block(float* sums, int64_t sums_ld, const BlockQ8_0* x, const W* w, int64_t blocks, bool) {
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) {
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const BlockQ8_0& xb = x[r * blocks + b];
        const W& wb = w[k * blocks + b];
        int32_t products = 0;
        for (int i = 0; i < BlockQ8_0::kElements; ++i) products += int32_t{xb.q[i]} * weight_level(wb, i);
        sum += static_cast<float>(products) * (f16_to_f32(xb.d) * f16_to_f32(wb.d));
      }
      sums[r * sums_ld + k] = sum;
    }
  }
}
#endif

template <typename W>
void dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, int64_t N, int64_t C, const W* weight, int64_t begin,
              int64_t end) {
  const int64_t blocks = C / BlockQ8_0::kElements;
  constexpr int kRows = 3, kWeightRows = 4;  // 12 accumulators: with the loads, the 16 ymm registers
  auto rows = [&]<int K>(int64_t o) {
    const W* w = weight + o * blocks;
    float* out = sums + (o - begin);
    int64_t n = 0;
    for (; n + kRows <= N; n += kRows) dot_block<kRows, K>(out + n * sums_ld, sums_ld, x + n * blocks, w, blocks, n == 0);
    if (N - n == 2) dot_block<2, K>(out + n * sums_ld, sums_ld, x + n * blocks, w, blocks, n == 0);
    if (N - n == 1) dot_block<1, K>(out + n * sums_ld, sums_ld, x + n * blocks, w, blocks, n == 0);
  };
  int64_t o = begin;
  for (; o + kWeightRows <= end; o += kWeightRows) rows.template operator()<kWeightRows>(o);
  for (; o < end; ++o) rows.template operator()<1>(o);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// GCC 12 takes the 512-bit conversions' undefined pass-through operand for an uninitialized read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// A tiled group's eight 64-byte operands of block b, operand k holding weights 4k..4k+3 of the
// 16 rows as unsigned bytes (the stored level, of which kOffset is taken back), and its scales.
template <typename W>
struct TileOperands;
template <>
struct TileOperands<BlockQ8_0> {  // the values + 128
  static constexpr int32_t kOffset = -128;
  static __m512i operand(const uint8_t* group, int64_t, int64_t b, int k) {
    return _mm512_loadu_si512(group + (b * 8 + k) * 64);
  }
  static const uint16_t* scales(const uint8_t* group, int64_t blocks) {
    return reinterpret_cast<const uint16_t*>(group + kQuantizedTileRows * blocks * 32);
  }
};
template <>
struct TileOperands<BlockQ5_0> {  // the 5-bit levels q (weight q - 16): a nibble and the mask's top bit
  static constexpr int32_t kOffset = -16;
  static __m512i operand(const uint8_t* group, int64_t blocks, int64_t b, int k) {
    const __m512i packed = _mm512_loadu_si512(group + (b * 4 + k % 4) * 64);
    const __m512i nibbles = _mm512_and_si512(_mm512_srli_epi16(packed, 4 * (k / 4)), _mm512_set1_epi8(0x0F));
    __mmask64 top;
    std::memcpy(&top, group + kQuantizedTileRows * blocks * 16 + (b * 8 + k) * 8, sizeof top);
    return _mm512_mask_add_epi8(nibbles, top, nibbles, _mm512_set1_epi8(0x10));
  }
  static const uint16_t* scales(const uint8_t* group, int64_t blocks) {
    return reinterpret_cast<const uint16_t*>(group + kQuantizedTileRows * blocks * 20);
  }
};

// R input rows times one group of 16 weight rows stored out_in_tiles: per block, each row's 16
// int32 sums start at the offset times the sum of its values and take eight vpdpbusd of four
// values broadcast against the operands, which are made once for all R rows; then one FMA per row
// of the sums by the scales' products. Brings `next`'s lines into the caches on the way (row_blocks.h).
template <typename W, int R>
void tile_block(float* sums, int64_t sums_ld, const BlockQ8_0* x, const float* x_scales, const int32_t* x_sums,
                int64_t blocks, const uint8_t* group, const NextWeightsShare& next) {
  using Operands = TileOperands<W>;
  const uint16_t* scales = Operands::scales(group, blocks);
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t l = 0; l < next.lines_per_step; ++l) {
      _mm_prefetch(next.first_line + (b * next.lines_per_step + l) * 64, _MM_HINT_T0);
    }
    __m512i dots[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) dots[r] = _mm512_set1_epi32(Operands::kOffset * x_sums[r * blocks + b]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i w = Operands::operand(group, blocks, b, k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dots[r] = _mm512_dpbusd_epi32(dots[r], w, broadcast_four_bytes(x[r * blocks + b].q + 4 * k));
    }
    const __m512 w_scales = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + b * 16)));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(x_scales[r * blocks + b]), w_scales);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), scale, acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(sums + r * sums_ld, acc[r]);
}

template <typename W>
void tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, const Q8_0TileTerms& terms, int64_t N, int64_t C,
                   const uint8_t* tiles, int64_t begin, int64_t end) {
  const int64_t blocks = C / BlockQ8_0::kElements;
  const size_t group_bytes = kQuantizedTileRows * blocks * sizeof(W);
  for (int64_t o = begin; o < end; o += kQuantizedTileRows) {
    const uint8_t* group = tiles + static_cast<size_t>(o / kQuantizedTileRows) * group_bytes;
    const uint8_t* next = o + kQuantizedTileRows < end ? group + group_bytes : nullptr;
    int64_t row_block = 0;
    for_each_row_block(N, [&]<int R>(int64_t n) {
      tile_block<W, R>(sums + n * sums_ld + (o - begin), sums_ld, x + n * blocks, terms.scales + n * blocks,
                       terms.sums + n * blocks, blocks, group,
                       next_weights_share(next, static_cast<int64_t>(group_bytes), N, row_block++, blocks));
    });
  }
}
#pragma GCC diagnostic pop
#endif

}  // namespace

Q8_0TileTerms q8_0_tile_terms(const BlockQ8_0* x, int64_t blocks) {
  thread_local std::vector<float> scales;
  thread_local std::vector<int32_t> sums;
  scales.resize(static_cast<size_t>(blocks));
  sums.resize(scales.size());
  for (int64_t i = 0; i < blocks; ++i) {
    int32_t sum = 0;
    for (int8_t value : x[i].q) sum += value;
    scales[static_cast<size_t>(i)] = f16_to_f32(x[i].d);
    sums[static_cast<size_t>(i)] = sum;
  }
  return {scales.data(), sums.data()};
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
void q8_0_tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, const Q8_0TileTerms& terms, int64_t N,
                        int64_t C, const uint8_t* tiles, int64_t begin, int64_t end) {
  tile_dot_rows<BlockQ8_0>(sums, sums_ld, x, terms, N, C, tiles, begin, end);
}

void q5_0_tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, const Q8_0TileTerms& terms, int64_t N,
                        int64_t C, const uint8_t* tiles, int64_t begin, int64_t end) {
  tile_dot_rows<BlockQ5_0>(sums, sums_ld, x, terms, N, C, tiles, begin, end);
}
#else
void q8_0_tile_dot_rows(float*, int64_t, const BlockQ8_0*, const Q8_0TileTerms&, int64_t, int64_t, const uint8_t*, int64_t,
                        int64_t) {
  throw Error("q8_0_tile_dot_rows: this build has no AVX512_VNNI");
}

void q5_0_tile_dot_rows(float*, int64_t, const BlockQ8_0*, const Q8_0TileTerms&, int64_t, int64_t, const uint8_t*, int64_t,
                        int64_t) {
  throw Error("q5_0_tile_dot_rows: this build has no AVX512_VNNI");
}
#endif

void q8_0_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, int64_t N, int64_t C, const BlockQ8_0* weight,
                   int64_t begin, int64_t end) {
  dot_rows(sums, sums_ld, x, N, C, weight, begin, end);
}

void q5_0_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, int64_t N, int64_t C, const BlockQ5_0* weight,
                   int64_t begin, int64_t end) {
  dot_rows(sums, sums_ld, x, N, C, weight, begin, end);
}

}  // namespace paraflow::cpu
