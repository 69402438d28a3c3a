#include "backend/cpu/half_products.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/row_blocks.h"
#include "backend/kernel_args.h"
#include "base/error.h"
#include "tensor/dtype.h"

#if defined(__AVX512FP16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define PARAFLOW_HAVE_HALF_PRODUCTS 1
#endif

namespace paraflow::cpu {

namespace {
constexpr int64_t kChunk = 32;  // halves per 512-bit register: a group's 16 rows by one column pair
constexpr int64_t kGroup = 16;  // weight rows per out_in_tiles group
}  // namespace

int64_t half_row_length(int64_t columns) { return (columns + kChunk - 1) / kChunk * kChunk; }

double half_products_error_bound(double sum_abs, double unscale, int64_t columns) {
  const double u = std::ldexp(1.0, -11), u32 = std::ldexp(1.0, -24);
  const int64_t pairs = (columns + 1) / 2;
  const auto m = static_cast<double>(std::min(pairs, kHalfPairsPerSum));
  const double gamma = m * u / (1 - m * u);
  // In f32: each lane adds its half sums in turn, then an output adds its two lanes.
  const auto f32_additions = static_cast<double>((pairs + kHalfPairsPerSum - 1) / kHalfPairsPerSum + 1);
  // Half's subnormal spacing at the input's rounding and at each FMA (one per column per output).
  const auto subnormal_roundings = static_cast<double>(2 * columns);
  return (gamma * (1 + u) + u + f32_additions * u32) * sum_abs + subnormal_roundings * std::ldexp(1.0, -25) * unscale;
}

#ifdef PARAFLOW_HAVE_HALF_PRODUCTS
// GCC 12's _mm512_cvtph_ps, _mm512_cvtps_ph and _mm512_extracti64x4_epi64 pass an
// _mm512_undefined_*() it then flags as "may be used uninitialized": false positives of its own
// header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace {

// Output o's sum in f32 from the f32 row: for the rows after the last group, and for sums that
// overflowed half.
float f32_sum(const float* row, const uint16_t* weight, int64_t o, int64_t weight_rows, int64_t columns) {
  float sum = 0.0f;
  for (int64_t c = 0; c < columns; ++c) sum += row[c] * f16_to_f32(weight[tiles_offset(o, c, weight_rows, columns)]);
  return sum;
}

// R input rows times P groups over the column pairs [0, pairs) of a tile: R x P half
// accumulators, lane 2i + j holding the group's row i's products of even (j = 0) or odd (j = 1)
// columns, as the tiles interleave them. Then each is widened and added to its two f32 vectors
// in totals[R][P][32].
template <int R, int P>
void half_tile_block(float* totals, const _Float16* x, int64_t x_ld, const _Float16* w, int64_t group_stride,
                     int64_t pairs) {
  __m512h acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < P; ++g) acc[r][g] = _mm512_setzero_ph();
  }
#pragma GCC unroll 2
  for (int64_t p = 0; p < pairs; ++p) {
    __m512h wv[P];
#pragma GCC unroll 3
    for (int g = 0; g < P; ++g) wv[g] = _mm512_loadu_ph(w + g * group_stride + p * kChunk);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, x + r * x_ld + 2 * p, sizeof pair);
      const __m512h xv = _mm512_castsi512_ph(_mm512_set1_epi32(pair));
#pragma GCC unroll 3
      for (int g = 0; g < P; ++g) acc[r][g] = _mm512_fmadd_ph(xv, wv[g], acc[r][g]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < P; ++g) {
      float* t = totals + (r * P + g) * 2 * kGroup;
      const __m512i bits = _mm512_castph_si512(acc[r][g]);
      _mm512_store_ps(t, _mm512_add_ps(_mm512_load_ps(t), _mm512_cvtph_ps(_mm512_castsi512_si256(bits))));
      _mm512_store_ps(t + 16, _mm512_add_ps(_mm512_load_ps(t + 16), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1))));
    }
  }
}

// All rows times P groups (the weight from `w`), a tile of kHalfPairsPerSum column pairs at a
// time (P x 4 KiB, in L1 while every block of input rows passes by), the rows in blocks as even
// in size as can be (17 rows: 6, 6, 5). totals: rows x P x 32 floats, 64-byte aligned.
template <int P>
void rows_times_groups(float* sums, int64_t sums_ld, const _Float16* x, int64_t x_ld, const float* unscale,
                       int64_t rows, const _Float16* w, int64_t group_stride, int64_t pairs, float* totals) {
  std::fill(totals, totals + rows * P * 2 * kGroup, 0.0f);
  for (int64_t first = 0; first < pairs; first += kHalfPairsPerSum) {
    const int64_t tile = std::min(kHalfPairsPerSum, pairs - first);
    for_each_row_block(rows, [&]<int R>(int64_t n) {
      half_tile_block<R, P>(totals + n * P * 2 * kGroup, x + n * x_ld + 2 * first, x_ld, w + first * kChunk,
                            group_stride, tile);
    });
  }
  // Each output's two lanes (even and odd columns) added, times its row's unscale.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t n = 0; n < rows; ++n) {
    for (int g = 0; g < P; ++g) {
      const float* t = totals + (n * P + g) * 2 * kGroup;
      const __m512 lo = _mm512_load_ps(t), hi = _mm512_load_ps(t + 16);
      const __m512 sum = _mm512_add_ps(_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi));
      _mm512_storeu_ps(sums + n * sums_ld + g * kGroup, _mm512_mul_ps(sum, _mm512_set1_ps(unscale[n])));
    }
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
                   int64_t rows, int64_t columns, const uint16_t* weight, int64_t weight_rows, int64_t begin,
                   int64_t end) {
  const int64_t x_ld = half_row_length(columns), pairs = columns / 2, group_stride = kGroup * columns;
  const int64_t grouped_end = std::max(begin, std::min(end, weight_rows / kGroup * kGroup));
  const int64_t groups = (grouped_end - begin) / kGroup;
  const auto* xh = reinterpret_cast<const _Float16*>(half_x);
  const auto* w = reinterpret_cast<const _Float16*>(weight) + begin * columns;
  // The f32 sums of a block of groups, for every row: kept per thread, grown as needed.
  static thread_local std::vector<float> totals_buffer;
  totals_buffer.resize(std::max(totals_buffer.size(), static_cast<size_t>(rows * kMaxBlockGroups * 2 * kGroup + 16)));
  auto* totals = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(totals_buffer.data()) + 63) / 64 * 64);
  auto block = [&]<int P>(int64_t g) {
    rows_times_groups<P>(sums + g * kGroup, sums_ld, xh, x_ld, unscale, rows, w + g * group_stride, group_stride, pairs,
                         totals);
  };
  for_each_group_block(groups, block);
  for (int64_t n = 0; n < rows; ++n) {
    float* row_sums = sums + n * sums_ld - begin;
    const float* row = x + n * columns;
    for (int64_t o = begin; o < end; ++o) {
      if (o < grouped_end && std::isfinite(row_sums[o])) continue;
      row_sums[o] = f32_sum(row, weight, o, weight_rows, columns);
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
                   int64_t, int64_t, int64_t) {
  throw Error("half_products: this build has no AVX512_FP16 code (the caller checks has_half_products)");
}
#endif

}  // namespace paraflow::cpu
