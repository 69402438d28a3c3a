#include "backend/cpu/bf16_pair_products.h"

#include <algorithm>

#include "backend/cpu/row_blocks.h"
#include "base/error.h"

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace paraflow::cpu {

#ifdef __AVX512BF16__
namespace {

constexpr int64_t kGroup = 16;  // weight rows per out_in_tiles group
constexpr int64_t kChunk = 32;  // bf16 values per register: a group's 16 rows by one column pair
constexpr int64_t kLine = 64;   // bytes per cache line: one column pair of a group

// R input rows times P groups over column pairs [0, pairs), a register block of row_blocks.h.
// Unlike the half products, no column tiles: the f32 sums need no flushing, and with one block of
// rows (batch-1 decoding) the groups streamed whole ran ~7% faster; at 32 and 64 rows tiles of 64
// pairs measured within the noise (the weights a block reads stay in L2 for the next).
// `prefetch`, when set, is where this pass brings lines_per_pair lines a column pair into L2.
template <int R, int P>
void pair_block(float* sums, int64_t sums_ld, const uint16_t* x, int64_t x_ld, const uint16_t* w, int64_t group_stride,
                int64_t pairs, const char* prefetch, int lines_per_pair) {
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < P; ++g) acc[r][g] = _mm512_setzero_ps();
  }
#pragma GCC unroll 2
  for (int64_t p = 0; p < pairs; ++p) {
    if (prefetch != nullptr) {
      for (int l = 0; l < lines_per_pair; ++l) _mm_prefetch(prefetch + (p * lines_per_pair + l) * kLine, _MM_HINT_T1);
    }
    __m512bh wv[P];
#pragma GCC unroll 3
    for (int g = 0; g < P; ++g) wv[g] = (__m512bh)_mm512_loadu_si512(w + g * group_stride + p * kChunk);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, x + r * x_ld + 2 * p, sizeof pair);
      const auto xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 3
      for (int g = 0; g < P; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], xv, wv[g]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < P; ++g) _mm512_storeu_ps(sums + r * sums_ld + g * kGroup, acc[r][g]);
  }
}

// All rows times P groups (w the first group's start), in blocks of rows. The first block of rows
// waits on the groups' stream from memory, the others read them from L2 at the arithmetic's pace;
// those later blocks bring the next P groups (`next`, when there are) into L2 meanwhile, so that
// the stream of the next block overlaps this one's arithmetic: 124M-shaped decoding steps of ~29
// rows 1.09x faster on Zen 4, gpt-small's 1.06x (bench/RESULTS.md).
template <int P>
void rows_times_groups(float* sums, int64_t sums_ld, const uint16_t* x, int64_t rows, int64_t columns,
                       const uint16_t* w, const uint16_t* next) {
  const int64_t pairs = columns / 2, group_stride = kGroup * columns;
  const int64_t row_blocks = (rows + kMaxBlockRows - 1) / kMaxBlockRows;
  // The next P groups spread over the row blocks after the first: ceil(P / (row_blocks - 1)) groups each.
  const int lines_per_pair = row_blocks > 1 ? static_cast<int>((P + row_blocks - 2) / (row_blocks - 1)) : 0;
  int64_t row_block = 0;
  for_each_row_block(rows, [&]<int R>(int64_t n) {
    const int64_t first_group = (row_block - 1) * lines_per_pair;  // of the next block, this pass brings in
    const char* prefetch = next != nullptr && row_block > 0 && first_group < P
                               ? reinterpret_cast<const char*>(next) + first_group * pairs * kLine
                               : nullptr;
    pair_block<R, P>(sums + n * sums_ld, sums_ld, x + n * columns, columns, w, group_stride, pairs, prefetch,
                     lines_per_pair);
    ++row_block;
  });
}

}  // namespace

void bf16_pair_products(float* sums, int64_t sums_ld, const uint16_t* x, int64_t rows, int64_t columns,
                        const uint16_t* weight, int64_t begin, int64_t end) {
  const int64_t groups = (end - begin) / kGroup;
  auto block = [&]<int P>(int64_t g) {
    const uint16_t* next = g + P < groups ? weight + (begin + (g + P) * kGroup) * columns : nullptr;
    rows_times_groups<P>(sums + g * kGroup, sums_ld, x, rows, columns, weight + (begin + g * kGroup) * columns, next);
  };
  if (rows > 1) {
    for_each_group_block(groups, block);
    return;
  }
  // One input row (batch-1 decoding) is bound by the weights' stream, and a group at a time keeps
  // each thread on one contiguous stream: on Zen 4 the products read at 1.04-1.09 of a plain read
  // of the same matrices this way, at 0.90-0.98 with three groups' streams (bench/RESULTS.md).
  for (int64_t g = 0; g < groups; ++g) block.template operator()<1>(g);
}
#else
void bf16_pair_products(float*, int64_t, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t) {
  throw Error("bf16_pair_products: this build has no AVX512_BF16 code");
}
#endif

}  // namespace paraflow::cpu
