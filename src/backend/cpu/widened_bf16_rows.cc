#include "backend/cpu/widened_bf16_rows.h"

#include <algorithm>

#include "base/error.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "backend/cpu/avx2.h"
#define PARAFLOW_HAVE_WIDENED_BF16 1
#endif

namespace paraflow::cpu {

namespace {
constexpr int64_t kChunk = 32;  // bf16 columns per 512-bit load
}  // namespace

int64_t split_row_length(int64_t columns) { return (columns + kChunk - 1) / kChunk * kChunk; }

#ifdef PARAFLOW_HAVE_WIDENED_BF16
namespace {

// A bf16 value is the top half of its f32: in a 32-bit lane holding two of them (the even column
// low), the even one is the lane shifted up, the odd one the lane with its low half cleared.
inline __m512 even_columns(__m512i pairs) { return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, pairs, 16)); }
inline __m512 odd_columns(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// GCC 12's _mm512_reduce_add_ps extracts from an _mm256_undefined_pd() it then flags as "may be
// used uninitialized": a false positive of its own header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// R split input rows times K weight rows: R x K accumulators (16 with R = K = 4, plus 2K widened
// weight vectors and two input halves: 26 of the 32 registers), each adding a chunk's even
// products and then its odd ones, summed across lanes at the end. With `prefetch_ahead` (weight
// elements) the K weight rows that far on are fetched into L2 meanwhile, chunk by chunk: the
// hardware prefetcher does not follow K interleaved row streams.
template <int R, int K>
void dot_block(float* sums, int64_t sums_ld, const float* x, int64_t x_ld, const uint16_t* w, int64_t columns,
               int64_t prefetch_ahead) {
  __m512 acc[R][K];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) acc[r][k] = _mm512_setzero_ps();
  }
  // One chunk of 32 columns; the last one, if shorter, under `mask` (the split rows are zero there).
  auto chunk = [&](int64_t c, __mmask32 mask, bool masked) __attribute__((always_inline)) {
    __m512 even[K], odd[K];
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      if (prefetch_ahead > 0) _mm_prefetch(reinterpret_cast<const char*>(w + prefetch_ahead + k * columns + c), _MM_HINT_T1);
      const uint16_t* from = w + k * columns + c;
      const __m512i pairs = masked ? _mm512_maskz_loadu_epi16(mask, from) : _mm512_loadu_si512(from);
      even[k] = even_columns(pairs);
      odd[k] = odd_columns(pairs);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 x_even = _mm512_loadu_ps(x + r * x_ld + c), x_odd = _mm512_loadu_ps(x + r * x_ld + c + 16);
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        acc[r][k] = _mm512_fmadd_ps(x_even, even[k], acc[r][k]);
        acc[r][k] = _mm512_fmadd_ps(x_odd, odd[k], acc[r][k]);
      }
    }
  };
  const int64_t full = columns / kChunk * kChunk;
  for (int64_t c = 0; c < full; c += kChunk) chunk(c, ~__mmask32{0}, false);
  if (full < columns) chunk(full, mask_of_32(columns, full), true);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    if constexpr (K == 4) {
      _mm_storeu_ps(sums + r * sums_ld, sum_each(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) sums[r * sums_ld + k] = _mm512_reduce_add_ps(acc[r][k]);
    }
  }
}
#pragma GCC diagnostic pop

// R input rows (at most four) times the weight rows [begin, end), four at a time.
template <int R>
void rows_times_weights(float* sums, int64_t sums_ld, const float* x, int64_t x_ld, int64_t columns,
                        const uint16_t* weight, int64_t begin, int64_t end, int64_t prefetch_ahead) {
  int64_t o = begin;
  for (; o + 4 <= end; o += 4) {
    dot_block<R, 4>(sums + (o - begin), sums_ld, x, x_ld, weight + o * columns, columns, prefetch_ahead);
  }
  for (; o < end; ++o) dot_block<R, 1>(sums + (o - begin), sums_ld, x, x_ld, weight + o * columns, columns, 0);
}

}  // namespace

void split_bf16_rows(float* split, const uint16_t* x, int64_t rows, int64_t columns) {
  const int64_t length = split_row_length(columns);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t c = 0; c < columns; c += kChunk) {
      const __m512i pairs = _mm512_maskz_loadu_epi16(mask_of_32(columns, c), x + n * columns + c);
      _mm512_storeu_ps(split + n * length + c, even_columns(pairs));
      _mm512_storeu_ps(split + n * length + c + 16, odd_columns(pairs));
    }
  }
}

void widened_bf16_products(float* sums, int64_t sums_ld, const float* split_x, int64_t rows, int64_t columns,
                           const uint16_t* weight, int64_t begin, int64_t end) {
  // The share's weight rows in tiles of about 24 KiB, in L1 while every block of four input rows
  // passes by. The first block fetches the next tile into L2 meanwhile, so that reading the weights
  // from memory overlaps the other blocks' arithmetic.
  const int64_t x_ld = split_row_length(columns);
  const int64_t tile = std::max<int64_t>(4, (24 << 10) / (2 * columns) / 4 * 4);
  for (int64_t first = begin; first < end; first += tile) {
    const int64_t last = std::min(end, first + tile);
    for (int64_t n = 0; n < rows; n += 4) {
      const float* x = split_x + n * x_ld;
      float* block_sums = sums + n * sums_ld + (first - begin);
      const int64_t prefetch_ahead = n == 0 ? tile * columns : 0;
      switch (std::min<int64_t>(4, rows - n)) {
        case 4: rows_times_weights<4>(block_sums, sums_ld, x, x_ld, columns, weight, first, last, prefetch_ahead); break;
        case 3: rows_times_weights<3>(block_sums, sums_ld, x, x_ld, columns, weight, first, last, prefetch_ahead); break;
        case 2: rows_times_weights<2>(block_sums, sums_ld, x, x_ld, columns, weight, first, last, prefetch_ahead); break;
        default: rows_times_weights<1>(block_sums, sums_ld, x, x_ld, columns, weight, first, last, prefetch_ahead); break;
      }
    }
  }
}
#else
void split_bf16_rows(float*, const uint16_t*, int64_t, int64_t) {
  throw Error("split_bf16_rows: this build has no AVX-512 code (the caller checks for AVX512_BF16)");
}
void widened_bf16_products(float*, int64_t, const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t) {
  throw Error("widened_bf16_products: this build has no AVX-512 code (the caller checks for AVX512_BF16)");
}
#endif

}  // namespace paraflow::cpu
