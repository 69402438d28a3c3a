#include "backend/cpu/half_products.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "tensor/dtype.h"

#if defined(__AVX512FP16__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "backend/cpu/avx2.h"
#define PARAFLOW_HAVE_HALF_PRODUCTS 1
#endif

namespace paraflow::cpu {

namespace {
constexpr int64_t kChunk = 32;  // halves per 512-bit load
}  // namespace

int64_t half_row_length(int64_t columns) { return (columns + kChunk - 1) / kChunk * kChunk; }

double half_products_error_bound(double sum_abs, double unscale, int64_t columns) {
  const double u = std::ldexp(1.0, -11), u32 = std::ldexp(1.0, -24);
  const int64_t chunks = (columns + kChunk - 1) / kChunk;
  const auto m = static_cast<double>(std::min(chunks, kHalfChunksPerSum));
  const double gamma = m * u / (1 - m * u);
  const auto f32_additions = static_cast<double>((chunks + kHalfChunksPerSum - 1) / kHalfChunksPerSum + 5);
  const double subnormal_roundings = static_cast<double>(kChunk * chunks + columns);
  return (gamma * (1 + u) + u + f32_additions * u32) * sum_abs + subnormal_roundings * std::ldexp(1.0, -25) * unscale;
}

#ifdef PARAFLOW_HAVE_HALF_PRODUCTS
// GCC 12's _mm512_cvtph_ps, _mm512_cvtps_ph, _mm512_extracti64x4_epi64 and _mm512_reduce_add_ps
// pass an _mm512_undefined_*() it then flags as "may be used uninitialized": false positives of
// its own header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace {

// A half vector's 32 lanes added pairwise into 16 f32 ones (lane i plus lane i + 16).
inline __m512 widened_pairs(__m512h sums) {
  const __m512i bits = _mm512_castph_si512(sums);
  return _mm512_add_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(bits)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1)));
}

// R half input rows times K weight rows: R x K half accumulators, each summing
// kHalfChunksPerSum chunks (unrolled: a loop of one chunk ran at half the rate) before it is
// widened and added to its f32 sum, kept in memory (once per 768 columns). R = 4, K = 5: 20
// accumulators, five weight vectors and an input one in the 32 registers; each input vector is
// read for five FMAs, which keeps the input rows' traffic from L2 (a 32-row step's rows do not fit
// L1 beside a weight tile) below what L2 delivers: 4 x 3 ran at ~0.6x (bench/RESULTS.md). With
// `prefetch_ahead` (weight elements) the K weight rows that far on are fetched into L2 meanwhile,
// chunk by chunk: the hardware prefetcher does not follow K interleaved row streams.
template <int R, int K>
void half_block(float* sums, int64_t sums_ld, const _Float16* x, int64_t x_ld, const _Float16* w, int64_t columns,
                int64_t prefetch_ahead) {
  alignas(64) float total[R][K][16] = {};
  // One chunk of 32 columns into the half sums (the last one, if shorter, under a mask).
  auto chunk = [&](__m512h (&part)[R][K], int64_t c, bool masked) __attribute__((always_inline)) {
    const __mmask32 mask = masked ? mask_of_32(columns, c) : ~__mmask32{0};
    __m512h wv[K];
#pragma GCC unroll 5
    for (int k = 0; k < K; ++k) {
      if (prefetch_ahead > 0) _mm_prefetch(reinterpret_cast<const char*>(w + prefetch_ahead + k * columns + c), _MM_HINT_T1);
      wv[k] = masked ? _mm512_castsi512_ph(_mm512_maskz_loadu_epi16(mask, w + k * columns + c)) : _mm512_loadu_ph(w + k * columns + c);
    }
#pragma GCC unroll 5
    for (int r = 0; r < R; ++r) {
      const __m512h xv = _mm512_loadu_ph(x + r * x_ld + c);
#pragma GCC unroll 5
      for (int k = 0; k < K; ++k) part[r][k] = _mm512_fmadd_ph(xv, wv[k], part[r][k]);
    }
  };
  auto add_to_total = [&](__m512h (&part)[R][K]) __attribute__((always_inline)) {
#pragma GCC unroll 5
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 5
      for (int k = 0; k < K; ++k) _mm512_store_ps(total[r][k], _mm512_add_ps(_mm512_load_ps(total[r][k]), widened_pairs(part[r][k])));
    }
  };
  auto zero = [&](__m512h (&part)[R][K]) __attribute__((always_inline)) {
#pragma GCC unroll 5
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 5
      for (int k = 0; k < K; ++k) part[r][k] = _mm512_setzero_ph();
    }
  };
  const int64_t full_chunks = columns / kChunk, chunks = (columns + kChunk - 1) / kChunk;
  int64_t first = 0;
  // Whole sums of kHalfChunksPerSum full chunks, unrolled (a loop of one chunk ran at half the rate).
  for (; first + kHalfChunksPerSum <= full_chunks; first += kHalfChunksPerSum) {
    __m512h part[R][K];
    zero(part);
#pragma GCC unroll 24
    for (int64_t f = 0; f < kHalfChunksPerSum; ++f) chunk(part, (first + f) * kChunk, false);
    add_to_total(part);
  }
  if (first < chunks) {
    __m512h part[R][K];
    zero(part);
    for (int64_t c = first; c < chunks; ++c) chunk(part, c * kChunk, c >= full_chunks);
    add_to_total(part);
  }
  // The lane sums, four outputs at a time where there are four (sum_each: bit for bit
  // _mm512_reduce_add_ps', which takes the rest).
  auto output = [&](int i) -> float& { return sums[i / K * sums_ld + i % K]; };
  int i = 0;
#pragma GCC unroll 5
  for (; i + 4 <= R * K; i += 4) {
    alignas(16) float four[4];
    _mm_store_ps(four, sum_each(_mm512_load_ps(total[i / K][i % K]), _mm512_load_ps(total[(i + 1) / K][(i + 1) % K]),
                                _mm512_load_ps(total[(i + 2) / K][(i + 2) % K]),
                                _mm512_load_ps(total[(i + 3) / K][(i + 3) % K])));
    for (int j = 0; j < 4; ++j) output(i + j) = four[j];
  }
  for (; i < R * K; ++i) output(i) = _mm512_reduce_add_ps(_mm512_load_ps(total[i / K][i % K]));
}

constexpr int kInputRows = 4, kWeightRows = 5;

// R input rows (at most kInputRows) times the weight rows [begin, end), kWeightRows at a time,
// the rest (fewer) in one block: a block of one weight row reads an input vector per FMA.
template <int R>
void rows_times_weights(float* sums, int64_t sums_ld, const _Float16* x, int64_t x_ld, int64_t columns,
                        const _Float16* weight, int64_t begin, int64_t end, int64_t prefetch_ahead) {
  int64_t o = begin;
  for (; o + kWeightRows <= end; o += kWeightRows) {
    half_block<R, kWeightRows>(sums + (o - begin), sums_ld, x, x_ld, weight + o * columns, columns, prefetch_ahead);
  }
  auto rest = [&]<int K>() { half_block<R, K>(sums + (o - begin), sums_ld, x, x_ld, weight + o * columns, columns, 0); };
  switch (end - o) {
    case 4: rest.template operator()<4>(); break;
    case 3: rest.template operator()<3>(); break;
    case 2: rest.template operator()<2>(); break;
    case 1: rest.template operator()<1>(); break;
    default: break;
  }
}

}  // namespace

bool has_half_products() { return true; }

void half_rows(uint16_t* half, float* unscale, const float* x, int64_t rows, int64_t columns) {
  const int64_t length = half_row_length(columns);
  for (int64_t n = 0; n < rows; ++n) {
    const float* row = x + n * columns;
    float largest = 0.0f;
    for (int64_t c = 0; c < columns; ++c) largest = std::max(largest, std::fabs(row[c]));
    // largest = m 2^e with m in [0.5, 1): times 2^(5 - e) it lies in [16, 32). Rows of zeros,
    // infinities or NaNs keep scale 1; the exponent is clamped so that both factors are normal.
    int exponent = 0;
    if (std::isfinite(largest) && largest > 0.0f) std::frexp(largest, &exponent);
    const int shift = std::clamp(5 - exponent, -120, 120);
    const float scale = std::ldexp(1.0f, shift);
    unscale[n] = std::ldexp(1.0f, -shift);
    uint16_t* to = half + n * length;
    int64_t c = 0;
    for (; c + 16 <= columns; c += 16) {
      const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(row + c), _mm512_set1_ps(scale));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + c), _mm512_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; c < columns; ++c) to[c] = f32_to_f16(row[c] * scale);
    std::fill(to + columns, to + length, uint16_t{0});
  }
}

void half_products(float* sums, int64_t sums_ld, const uint16_t* half_x, const float* unscale, const float* x,
                   int64_t rows, int64_t columns, const uint16_t* weight, int64_t begin, int64_t end) {
  // The share's weight rows in tiles of about 24 KiB, in L1 while every block of input rows
  // passes by. The first block fetches the next tile into L2 meanwhile, so that reading the weights
  // from memory overlaps the other blocks' arithmetic.
  const int64_t x_ld = half_row_length(columns);
  const int64_t tile = std::max<int64_t>(kWeightRows, (24 << 10) / (2 * columns) / kWeightRows * kWeightRows);
  const auto* xh = reinterpret_cast<const _Float16*>(half_x);
  const auto* w = reinterpret_cast<const _Float16*>(weight);
  for (int64_t first = begin; first < end; first += tile) {
    const int64_t last = std::min(end, first + tile);
    // Blocks of input rows as even in size as can be (17 rows: 4, 4, 3, 3, 3, not 4, 4, 4, 4, 1).
    const int64_t blocks = (rows + kInputRows - 1) / kInputRows;
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t n = rows * block / blocks;
      const _Float16* xn = xh + n * x_ld;
      float* block_sums = sums + n * sums_ld + (first - begin);
      const int64_t prefetch_ahead = n == 0 ? tile * columns : 0;
      switch (rows * (block + 1) / blocks - n) {
        case 4: rows_times_weights<4>(block_sums, sums_ld, xn, x_ld, columns, w, first, last, prefetch_ahead); break;
        case 3: rows_times_weights<3>(block_sums, sums_ld, xn, x_ld, columns, w, first, last, prefetch_ahead); break;
        case 2: rows_times_weights<2>(block_sums, sums_ld, xn, x_ld, columns, w, first, last, prefetch_ahead); break;
        default: rows_times_weights<1>(block_sums, sums_ld, xn, x_ld, columns, w, first, last, prefetch_ahead); break;
      }
    }
  }
  for (int64_t n = 0; n < rows; ++n) {
    float* row_sums = sums + n * sums_ld;
    const float* row = x + n * columns;
    for (int64_t o = begin; o < end; ++o) {
      float& sum = row_sums[o - begin];
      sum *= unscale[n];
      if (std::isfinite(sum)) continue;
      // Half overflowed, or the row holds a NaN or an infinity: summed again in f32.
      const uint16_t* weight_row = weight + o * columns;
      float exact = 0.0f;
      for (int64_t c = 0; c < columns; ++c) exact += row[c] * f16_to_f32(weight_row[c]);
      sum = exact;
    }
  }
}
#pragma GCC diagnostic pop
#else
bool has_half_products() { return false; }
void half_rows(uint16_t*, float*, const float*, int64_t, int64_t) {
  throw Error("half_rows: this build has no AVX512_FP16 code (the caller checks has_half_products)");
}
void half_products(float*, int64_t, const uint16_t*, const float*, const float*, int64_t, int64_t, const uint16_t*,
                   int64_t, int64_t) {
  throw Error("half_products: this build has no AVX512_FP16 code (the caller checks has_half_products)");
}
#endif

}  // namespace paraflow::cpu
