// matmul forward and backward, in f32 (sgemm) and with bf16 operands (oneDNN on AMX or
// AVX512_BF16, f32 accumulation). The two share their epilogues: the GELU pass after the GEMM,
// and one pass over the output gradient that applies the GELU's derivative, sums the bias
// gradient and writes the GEMMs' operand.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/bf16_pair_products.h"
#include "backend/cpu/avx2.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/half_products.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/q4_k_products.h"
#include "backend/cpu/q8_0_products.h"
#include "backend/cpu/quantize_rows.h"
#include "backend/cpu/storage.h"
#include "backend/cpu/widened_bf16_rows.h"
#include "backend/quantized_tiles.h"
#include "base/error.h"

namespace paraflow::cpu {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

struct MatmulDims {
  int64_t N, C, OC;
  bool transposed;   // weight [OC,C] (out_in, out_in_interleaved or out_in_tiles) rather than [C,OC]
  bool interleaved;  // out_in_interleaved: only the row-streaming kernel reads it
  bool tiled;        // out_in_tiles: only the tile kernels (AMX, pair products) read it
  int64_t weight_ld() const { return transposed ? C : OC; }
  bool stored_for_decoding() const { return interleaved || tiled; }
};

template <typename Args>
MatmulDims dims_of(const Args& args, const Tensor& output) {
  const int64_t C = args.inp.shape()[args.inp.shape().rank() - 1];
  return {args.inp.numel() / C, C, output.shape()[output.shape().rank() - 1], args.layout != WeightLayout::in_out,
          args.layout == WeightLayout::out_in_interleaved, args.layout == WeightLayout::out_in_tiles};
}

// GELU (tanh form) at x, and its derivative there into `slope`. The forward pass keeps the slope
// rather than x: it is all the backward pass needs of x, and computing it here reuses the tanh,
// which otherwise made GELU's backward pass three times as slow as a plain pass over its rows.
#pragma omp declare simd notinbranch
inline float gelu_with_slope(float x, float& slope) {
  const float t = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
  slope = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * x * (1.0f + t);
}

// One row of GELU over a product's sums plus the bias (if any), into out_row, which may be
// sums_row itself; with KeepSlope, sums_row becomes the slope (a separate row then). Without it
// the compiler drops the slope's arithmetic.
template <bool KeepSlope, typename Out, typename Sum>
inline void gelu_row(Out* out_row, Sum* sums_row, const float* bias, int64_t OC) {
#pragma omp simd
  for (int64_t o = 0; o < OC; ++o) {
    float slope;
    out_row[o] = from_float<Out>(gelu_with_slope(to_float(sums_row[o]) + (bias != nullptr ? bias[o] : 0.0f), slope));
    if constexpr (KeepSlope) sums_row[o] = from_float<Sum>(slope);
  }
}

// A product's rows finished in place: `sums` (N,OC) plus the bias; with gelu, out = GELU of that
// and `sums` becomes the slope (gelu_with_slope) unless it is `out` itself (no slope kept); without
// gelu, `sums` is out, and the bias is there to add.
template <typename Out, typename Sum>
void bias_and_gelu(Out* out, Sum* sums, const float* bias, bool gelu, int64_t N, int64_t OC) {
  const bool keep_slope = static_cast<void*>(out) != static_cast<void*>(sums);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Sum* row = sums + n * OC;
    if (!gelu) {
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) row[o] = from_float<Sum>(to_float(row[o]) + bias[o]);
    } else if (keep_slope) {
      gelu_row<true>(out + n * OC, row, bias, OC);
    } else {
      gelu_row<false>(out + n * OC, row, bias, OC);
    }
  }
}

// One row of output_gradient, with its options fixed at compile time so that the loop has no
// branches left to vectorise around.
template <bool Gelu, bool Sum, bool Write, typename In, typename Out, typename Slope>
inline void gradient_row(float* sums, const In* d, Out* g, const Slope* slope, int64_t OC) {
#pragma omp simd
  for (int64_t o = 0; o < OC; ++o) {
    float value = to_float(d[o]);
    if constexpr (Gelu) value *= to_float(slope[o]);
    if constexpr (Sum) sums[o] += value;
    if constexpr (Write) g[o] = from_float<Out>(value);
  }
}

// One row of a product's sums, finished: bias added, then (with GELU) GELU applied and, with
// KeepSlope, its slope kept; options fixed at compile time, as in gradient_row, so that the loop
// vectorises.
template <bool Gelu, bool Bias, bool KeepSlope, typename Out, typename Slope>
inline void finish_row(Out* out, Slope* slope, const float* sums, const float* bias, int64_t count) {
#pragma omp simd
  for (int64_t o = 0; o < count; ++o) {
    float value = sums[o];
    if constexpr (Bias) value += bias[o];
    if constexpr (Gelu) {
      float derivative;
      value = gelu_with_slope(value, derivative);
      if constexpr (KeepSlope) slope[o] = from_float<Slope>(derivative);
    }
    out[o] = from_float<Out>(value);
  }
}

// One pass over the output gradient dout (N,OC): g = dout · slope, GELU's derivative (or dout
// without GELU, slope null) is written to `grad` (may alias dout; null: not written) and summed
// into dbias (may be null). The rows go in one fixed block per thread asked for, each summed into
// its own partials (contiguous reads), added in block order: the result is the same on every run
// with the same thread count, and every block is done even when OpenMP grants a smaller team.
template <typename In, typename Out, typename Slope>
void output_gradient(float* dbias, const In* dout, Out* grad, const Slope* slope, int64_t N, int64_t OC) {
  const int blocks = omp_get_max_threads();
  std::vector<float> partial(dbias != nullptr ? static_cast<size_t>(blocks) * OC : 0, 0.0f);
#pragma omp parallel for schedule(static, 1)
  for (int block = 0; block < blocks; ++block) {
    float* sums = dbias != nullptr ? partial.data() + static_cast<int64_t>(block) * OC : nullptr;
    const int64_t begin = N * block / blocks, end = N * (block + 1) / blocks;
    for (int64_t n = begin; n < end; ++n) {
      const In* d = dout + n * OC;
      Out* g = grad != nullptr ? grad + n * OC : nullptr;
      const Slope* p = slope != nullptr ? slope + n * OC : nullptr;
      if (p != nullptr) {
        if (sums != nullptr) gradient_row<true, true, true>(sums, d, g, p, OC);
        else gradient_row<true, false, true>(sums, d, g, p, OC);
      } else if (g != nullptr) {
        if (sums != nullptr) gradient_row<false, true, true>(sums, d, g, p, OC);
        else gradient_row<false, false, true>(sums, d, g, p, OC);
      } else {
        gradient_row<false, true, false>(sums, d, g, p, OC);
      }
    }
  }
  if (dbias == nullptr) return;
  for (int block = 0; block < blocks; ++block) {
    const float* sums = partial.data() + static_cast<int64_t>(block) * OC;
#pragma omp simd
    for (int64_t o = 0; o < OC; ++o) dbias[o] += sums[o];
  }
}

// Decoding multiplies a handful of rows by each weight matrix: there the GEMM libraries, built
// for large products, leave much of the memory bandwidth unused. This pass streams the weights
// once, each thread a contiguous share of the output columns (in_out) or weight rows (out_in),
// converting bf16 to f32 in registers, and applies bias and GELU on the way out. f32 sums. Each
// output is summed in an order that depends on neither the number of rows nor the thread count,
// which makes it the row-invariant matmul too (any number of rows).
constexpr int64_t kSmallRows = 4;

// Whether bf16_dot_rows applies: bf16 x and weights, AVX512_BF16 compiled in.
template <typename X, typename W>
constexpr bool has_bf16_dot_rows() {
#ifdef __AVX512BF16__
  return std::is_same_v<X, BFloat16> && std::is_same_v<W, BFloat16>;
#else
  return false;
#endif
}

// Runs bf16_dot_rows (and the AMX tiles) where they apply: sums[n * sums_ld + (o - begin)].
template <typename X, typename W>
bool bf16_dot_rows_apply(float* sums, int64_t sums_ld, const X* inp, const W* weight, const MatmulDims& d,
                         int64_t begin, int64_t end);

#ifdef __AVX512BF16__
// GCC 12's _mm512_reduce_add_ps extracts from an _mm256_undefined_pd() it then flags as
// "may be used uninitialized" (or "is used uninitialized", inlined into a template): a false
// positive of its own header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// R input rows times four weight rows of length C: R x 4 independent f32 accumulators (enough
// to hide vdpbf16ps' latency once R reaches 2), summed horizontally at the end. Each output's
// sum runs over the same column chunks in the same order whatever R: batching changes nothing.
template <int R>
struct Bf16DotBlock {
  __m512 acc[R][4];

  // One chunk of 32 columns (fewer under `mask`) of the R rows and the four weight rows.
  inline __attribute__((always_inline)) void chunk(const BFloat16* x, const BFloat16* w, int64_t C, int64_t c,
                                                   __mmask32 mask) {
    __m512bh wv[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) wv[k] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + k * C + c);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * C + c);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], xv, wv[k]);
    }
  }

  inline __attribute__((always_inline)) void run(float* sums, int64_t sums_ld, const BFloat16* x, const BFloat16* w,
                                                 int64_t C, bool prefetch) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_ps();
    }
    const int64_t full = C / 32 * 32;
    int64_t c = 0;
    if (prefetch) {
      for (; c < full; c += 32) {
        // The next four rows' same columns, ahead of their turn: 87 -> 111 tokens/s on the GPT-2
        // 124M shape (the hardware prefetcher does not follow four interleaved row streams).
#pragma GCC unroll 4
        for (int k = 4; k < 8; ++k) _mm_prefetch(reinterpret_cast<const char*>(w + k * C + c), _MM_HINT_T0);
        chunk(x, w, C, c, ~__mmask32{0});
      }
    } else {
      for (; c < full; c += 32) chunk(x, w, C, c, ~__mmask32{0});
    }
    if (c < C) chunk(x, w, C, c, static_cast<__mmask32>((uint64_t{1} << (C - full)) - 1));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) sums[r * sums_ld + k] = _mm512_reduce_add_ps(acc[r][k]);
    }
  }
};

template <int R>
void bf16_dot_block(float* sums, int64_t sums_ld, const BFloat16* x, const BFloat16* w, int64_t C, bool prefetch) {
  Bf16DotBlock<R>().run(sums, sums_ld, x, w, C, prefetch);
}

// sums[n * sums_ld + (o - begin)] = x[n] · weight[o] for weight rows [begin, end) of length C, bf16
// pairs multiplied exactly and summed in f32 by AVX512_BF16's vdpbf16ps. Weight rows outermost:
// four of them stay in L1 while the input rows pass by, four at a time.
void bf16_dot_rows(float* sums, int64_t sums_ld, const BFloat16* inp, const BFloat16* weight, const MatmulDims& d,
                   int64_t begin, int64_t end) {
  const int64_t full = d.C / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (d.C - full)) - 1);
  int64_t o = begin;
  for (; o + 4 <= end; o += 4) {
    const BFloat16* w = weight + o * d.C;
    int64_t n = 0;
    for (; n + 4 <= d.N; n += 4) bf16_dot_block<4>(sums + n * sums_ld + (o - begin), sums_ld, inp + n * d.C, w, d.C, n == 0);
    const BFloat16* x = inp + n * d.C;
    float* row = sums + n * sums_ld + (o - begin);
    switch (d.N - n) {
      case 3: bf16_dot_block<3>(row, sums_ld, x, w, d.C, n == 0); break;
      case 2: bf16_dot_block<2>(row, sums_ld, x, w, d.C, n == 0); break;
      case 1: bf16_dot_block<1>(row, sums_ld, x, w, d.C, n == 0); break;
      default: break;
    }
  }
  for (; o < end; ++o) {
    for (int64_t n = 0; n < d.N; ++n) {
      const BFloat16* x = inp + n * d.C;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < d.C; c += 32) {
        const __mmask32 mask = c < full ? ~__mmask32{0} : tail;
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(mask, x + c),
                               (__m512bh)_mm512_maskz_loadu_epi16(mask, weight + o * d.C + c));
      }
      sums[n * sums_ld + (o - begin)] = _mm512_reduce_add_ps(acc);
    }
  }
}
#pragma GCC diagnostic pop
#endif

template <typename X, typename W>
bool bf16_dot_rows_apply(float* sums, int64_t sums_ld, const X* inp, const W* weight, const MatmulDims& d,
                         int64_t begin, int64_t end) {
#ifdef __AVX512BF16__
  if constexpr (has_bf16_dot_rows<X, W>()) {
    if (d.interleaved) return false;  // the f32 kernel reads that layout
    int64_t rows_begin = begin;  // the first output bf16_dot_rows takes
    if (d.tiled) {
      // Whole groups of 16 outputs on AMX tiles, or as outer products of column pairs without
      // AMX; the rows after the last group, stored out_in, below.
      rows_begin = std::max(begin, std::min(end, d.OC / 16 * 16));
      if (begin < rows_begin) {
        const auto* x = reinterpret_cast<const uint16_t*>(inp);
        const auto* w = reinterpret_cast<const uint16_t*>(weight);
        if (amx_tiles_available()) amx_tile_products(sums, sums_ld, x, d.N, d.C, w, begin, rows_begin);
        else bf16_pair_products(sums, sums_ld, x, d.N, d.C, w, begin, rows_begin);
      }
    }
    bf16_dot_rows(sums + (rows_begin - begin), sums_ld, inp, weight, d, rows_begin, end);
    return true;
  }
#endif
  (void)sums, (void)sums_ld, (void)inp, (void)weight, (void)d, (void)begin, (void)end;
  return false;
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kReadsInterleavedWeights = true;  // f32_dot_rows below
// The f32 counterpart of bf16_dot_rows, for CPUs without AVX512_BF16 and for f32 weights: f32
// input rows times [out, in] weight rows, f32 or bf16 (widened in registers, so bf16 weights
// move half the bytes). R input rows by K weight rows per pass, R x K independent 8-lane
// accumulators; each output sums its 8-column chunks in order and then its lanes in a fixed
// order, whatever R and K: the batch does not change a row's result.
inline float horizontal_sum(__m256 v) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 halves = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(halves, _mm_movehdup_ps(halves)));
}

template <int R, int K, typename W>
inline void f32_dot_block(float* sums, int64_t sums_ld, const float* x, const W* w, int64_t C, bool prefetch) {
  __m256 acc[R][K];
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) acc[r][k] = _mm256_setzero_ps();
  }
  auto chunk = [&](const float* xc, int64_t x_ld, const W* wc, int64_t w_ld) __attribute__((always_inline)) {
    __m256 wv[K];
    for (int k = 0; k < K; ++k) wv[k] = load8(wc + k * w_ld);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(xc + r * x_ld);
      for (int k = 0; k < K; ++k) acc[r][k] = _mm256_fmadd_ps(xv, wv[k], acc[r][k]);
    }
  };
  const int64_t full = C / 8 * 8;
  int64_t c = 0;
  if (prefetch) {
    // The next K rows' same cache line, ahead of their turn (the hardware prefetcher does not
    // follow K interleaved row streams): one prefetch per line, not per chunk.
    constexpr int64_t kLine = 64 / sizeof(W);
    for (; c + kLine <= full; c += kLine) {
      for (int k = K; k < 2 * K; ++k) _mm_prefetch(reinterpret_cast<const char*>(w + k * C + c), _MM_HINT_T0);
      for (int64_t part = 0; part < kLine; part += 8) chunk(x + c + part, C, w + c + part, C);
    }
  }
  for (; c < full; c += 8) chunk(x + c, C, w + c, C);
  if (full < C) {  // the last columns, zero-padded to one more chunk
    float x_tail[R][8] = {};
    W w_tail[K][8] = {};
    for (int64_t column = full; column < C; ++column) {
      for (int r = 0; r < R; ++r) x_tail[r][column - full] = x[r * C + column];
      for (int k = 0; k < K; ++k) w_tail[k][column - full] = w[k * C + column];
    }
    chunk(&x_tail[0][0], 8, &w_tail[0][0], 8);
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) sums[r * sums_ld + k] = horizontal_sum(acc[r][k]);
  }
}

// R input rows times P groups of an out_in_interleaved weight (w the first group's start; each
// group a panel of the [in, out] matrix, 16 outputs wide, the next one group_stride elements on),
// as outer products: per input column, each row's value broadcast times the panel's 16 weights,
// into R x 2P accumulators. Each output sums its columns one by one, in order, whatever R and P:
// the batch does not change a row's result. (The unroll pragmas keep the accumulators in
// registers: without them GCC stores every one to the stack each column.) With `prefetch`, the
// next P groups' same columns are fetched meanwhile, so that reading them from memory overlaps
// the arithmetic of the rows that follow.
template <int R, int P, typename W>
inline void panel_block(float* sums, int64_t sums_ld, const float* x, const W* w, int64_t C, int64_t group_stride,
                        bool prefetch) {
  static_assert(kInterleavedRows == 16);
  __m256 acc[R][2 * P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < 2 * P; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < C; ++c) {
    __m256 wv[2 * P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const W* panel = w + p * group_stride + c * kInterleavedRows;
      if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(panel + P * group_stride), _MM_HINT_T0);
      wv[2 * p] = load8(panel);
      wv[2 * p + 1] = load8(panel + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * C + c);
#pragma GCC unroll 8
      for (int j = 0; j < 2 * P; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < 2 * P; ++j) _mm256_storeu_ps(sums + r * sums_ld + j * 8, acc[r][j]);
  }
}

#ifdef __AVX512F__
// panel_block for one group with AVX-512: a panel's 16 weights are one vector, and blocks of up
// to kWidePanelRows rows (20, 24 and 28 measured no faster, 28 spilled) keep their sums in the 32
// registers, so that 32 rows read each panel from L1/L2 twice instead of six times, at twice the
// lanes per FMA (f32 serving's 32-sequence step: 1.2x). Each output still sums its columns one by
// one, in order: bit for bit panel_block's results.
constexpr int kWidePanelRows = 16;

template <int R, typename W>
void wide_panel_block(float* sums, int64_t sums_ld, const float* x, const W* w, int64_t C, int64_t group_stride,
                      bool prefetch) {
  static_assert(kInterleavedRows == 16);
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; ++c) {
    const W* panel = w + c * kInterleavedRows;
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(panel + group_stride), _MM_HINT_T0);
    const __m512 weights = load16(panel);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * C + c]), weights, acc[r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(sums + r * sums_ld, acc[r]);
}

// wide_panel_block<R> for R = 1 .. kWidePanelRows, by R - 1.
template <typename W, size_t... Index>
constexpr auto wide_panel_blocks(std::index_sequence<Index...>) {
  return std::array{&wide_panel_block<static_cast<int>(Index) + 1, W>...};
}
#endif

// Weight rows [begin, end) of an [out, in] weight (begin a multiple of kInterleavedRows).
// out_in_interleaved: whole groups as panels, in blocks of at most six input rows (12
// accumulators, two weight vectors and a broadcast: the 16 ymm registers; with AVX-512, blocks of
// up to kWidePanelRows) as even in size as can be, two groups at once for two rows (enough
// independent sums to hide the FMA latency), one at a time for one; the rows after the last
// whole group, and every row of an out_in weight, as dot products: four weight rows and three
// input rows at a time.
template <typename W>
void f32_dot_rows(float* sums, int64_t sums_ld, const float* x, const W* weight, const MatmulDims& d, int64_t begin,
                  int64_t end) {
  int64_t o = begin;
  if (d.interleaved) {
    constexpr int64_t kGroup = kInterleavedRows;
    const int64_t group_stride = kGroup * d.C, groups_end = begin + (end - begin) / kGroup * kGroup;
    // With up to six rows the hardware prefetcher keeps up (its stream is the weight's); with
    // more, the first block prefetches this thread's next group (8-32 rows: up to 1.2x; measured
    // with the AVX2 blocks, kept for the AVX-512 ones, which are as fast or faster at 3-16 rows).
    const bool prefetch = d.N > 6;
    auto panels = [&]<int R, int P>(int64_t n) {
      panel_block<R, P>(sums + n * sums_ld + (o - begin), sums_ld, x + n * d.C, weight + o * d.C, d.C, group_stride,
                        prefetch && n == 0 && o + kGroup * P < groups_end);
    };
    if (d.N == 1) {
      // One row (batch-1 decoding) is bound by the weights' stream: a group at a time keeps each
      // thread on one contiguous stream (on Zen 4 1.02-1.09 of a plain read, against 0.99-1.01 two
      // groups at a time: bench/RESULTS.md).
      for (; o < groups_end; o += kGroup) panels.template operator()<1, 1>(0);
    } else if (d.N == 2) {
      for (; o + 2 * kGroup <= groups_end; o += 2 * kGroup) panels.template operator()<2, 2>(0);
    }
#ifdef __AVX512F__
    if (d.N > 2) {
      static constexpr auto kBlocks = wide_panel_blocks<W>(std::make_index_sequence<kWidePanelRows>());
      const int64_t wide_blocks = (d.N + kWidePanelRows - 1) / kWidePanelRows;
      for (; o < groups_end; o += kGroup) {
        for (int64_t block = 0; block < wide_blocks; ++block) {
          const int64_t n = d.N * block / wide_blocks, rows = d.N * (block + 1) / wide_blocks - n;
          kBlocks[static_cast<size_t>(rows - 1)](sums + n * sums_ld + (o - begin), sums_ld, x + n * d.C,
                                                 weight + o * d.C, d.C, group_stride,
                                                 prefetch && n == 0 && o + kGroup < groups_end);
        }
      }
    }
#endif
    const int64_t blocks = (d.N + 5) / 6;
    for (; o < groups_end; o += kGroup) {
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t n = d.N * block / blocks;
        switch (d.N * (block + 1) / blocks - n) {
          case 6: panels.template operator()<6, 1>(n); break;
          case 5: panels.template operator()<5, 1>(n); break;
          case 4: panels.template operator()<4, 1>(n); break;
          case 3: panels.template operator()<3, 1>(n); break;
          case 2: panels.template operator()<2, 1>(n); break;
          default: panels.template operator()<1, 1>(n); break;
        }
      }
    }
  }
  constexpr int kRows = 3, kWeightRows = 4;  // 12 accumulators and 4 weight vectors: the 16 ymm registers
  auto rows = [&]<int K>(int64_t o) {
    const W* w = weight + o * d.C;
    auto block = [&]<int R>(int64_t n) {
      f32_dot_block<R, K>(sums + n * sums_ld + (o - begin), sums_ld, x + n * d.C, w, d.C, n == 0);
    };
    int64_t n = 0;
    for (; n + kRows <= d.N; n += kRows) block.template operator()<kRows>(n);
    if (d.N - n == 2) block.template operator()<2>(n);
    if (d.N - n == 1) block.template operator()<1>(n);
  };
  if (!d.interleaved) {
    for (; o + kWeightRows <= end; o += kWeightRows) rows.template operator()<kWeightRows>(o);
  }
  for (; o < end; ++o) rows.template operator()<1>(o);
}
#else
constexpr bool kReadsInterleavedWeights = false;
#endif

// A per-thread buffer that only grows, one per use (the tag): kept across calls, so that decoding
// allocates nothing per token and the backward pass nothing per step.
template <typename Use, typename T>
T* thread_scratch(int64_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < static_cast<size_t>(count)) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

// Whether bf16 rows times an [out, in] bf16 weight take widened_bf16_products (f32 FMAs) rather
// than bf16_dot_rows: where bf16 dot products run at half the FMA rate, by bf16_gemms_beat_f32's
// fixed rule (a request's tokens must not depend on which process served it).
template <typename X, typename W>
bool widens_bf16_products(const MatmulDims& d) {
  static const bool half_rate_dot_products = !bf16_gemms_beat_f32();
  return has_bf16_dot_rows<X, W>() && d.transposed && !d.stored_for_decoding() && half_rate_dot_products;
}

struct InputRows;        // small_rows_matmul's f32 input rows (the calling thread's)
struct OutputSums;       // small_rows_matmul's sums (a share's, one share at a time)
struct GradientOperand;  // the backward pass's bf16 GEMM operand, when dout is not one already
struct HalfInputRows;    // small_rows_matmul's input rows in half, for float16 weights
struct RowUnscales;      // and the factors that undo their scaling
struct QuantizedRows;    // small_rows_matmul's input rows in blocks, for block-quantized weights

// A block-quantized weight type's products: the blocks its input rows are quantized to, the
// kernel that multiplies the two, and the one for weights stored out_in_tiles (where the build has
// it). Other weight types have none.
struct NoTileTerms {};
template <typename W>
struct PackedProducts {
  static constexpr bool kPacked = false, kTiles = false;
  using Rows = void;
  using TileTerms = NoTileTerms;
};
template <>
struct PackedProducts<BlockQ8_0> {
  static constexpr bool kPacked = true, kTiles = has_quantized_tile_products();
  using Rows = BlockQ8_0;
  using TileTerms = Q8_0TileTerms;
  static constexpr auto quantize_rows = quantize_rows_q8_0;
  static constexpr auto dot_rows = q8_0_dot_rows;
  static constexpr auto tile_terms = q8_0_tile_terms;
  static constexpr auto tile_dot_rows = q8_0_tile_dot_rows;
};
template <>
struct PackedProducts<BlockQ5_0> {
  static constexpr bool kPacked = true, kTiles = has_quantized_tile_products();
  using Rows = BlockQ8_0;
  using TileTerms = Q8_0TileTerms;
  static constexpr auto quantize_rows = quantize_rows_q8_0;
  static constexpr auto dot_rows = q5_0_dot_rows;
  static constexpr auto tile_terms = q8_0_tile_terms;
  static constexpr auto tile_dot_rows = q5_0_tile_dot_rows;
};
template <>
struct PackedProducts<BlockQ4_K> {
  static constexpr bool kPacked = true, kTiles = has_quantized_tile_products();
  using Rows = BlockQ8_K;
  using TileTerms = Q4_KTileTerms;
  static constexpr auto quantize_rows = quantize_rows_q8_k;
  static constexpr auto dot_rows = q4_k_dot_rows;
  static constexpr auto tile_terms = q4_k_tile_terms;
  static constexpr auto tile_dot_rows = q4_k_tile_dot_rows;
};

template <typename X, typename W, typename Out, typename Slope>
void small_rows_matmul(Out* out, Slope* slope, const X* inp, const W* weight, const float* bias, const MatmulDims& d,
                       bool gelu) {
  check(!d.interleaved || kReadsInterleavedWeights,
        "matmul: this build has no kernel for out_in_interleaved weights (AVX2 and FMA needed)");
  // float16 weights [out, in] multiply the rows in half arithmetic, stored out_in_tiles, where the
  // CPU has it.
  constexpr bool half_weights = std::is_same_v<W, Float16>;
  const bool half_arithmetic = half_weights && d.tiled;
  using Packed = PackedProducts<W>;
  constexpr bool packed_weights = Packed::kPacked;
  check(!d.tiled || has_bf16_dot_rows<X, W>() || (half_weights && has_half_products()) || Packed::kTiles,
        "matmul: out_in_tiles weights are read only from bf16 inputs (AMX tiles or AVX512_BF16 pair products), "
        "in float16 by the half products on a CPU with AVX512_FP16, and block-quantized by AVX512_VNNI's products");
  check(!d.tiled || half_weights || packed_weights || d.C % 32 == 0,
        "matmul: an out_in_tiles weight needs whole tiles: {} input features are not a multiple of 32", d.C);
  check(!half_arithmetic || d.C % 2 == 0,
        "matmul: an out_in_tiles float16 weight needs whole column pairs: {} input features are odd", d.C);
  // Block-quantized weights [out, in] (or out_in_tiles), read as blocks of the rows; the input rows
  // quantized to blocks too.
  if constexpr (packed_weights) {
    check(d.transposed && !d.interleaved && d.C % W::kElements == 0,
          "matmul: {}-value block weights are read stored [out, in] or out_in_tiles with whole blocks (got {} input "
          "features)", W::kElements, d.C);
  }
  // The few input rows in f32 (f32 rows as they are; bf16 ones converted once rather than once
  // per weight row); the bf16 dot products (and AMX tiles) read the bf16 rows themselves, and
  // widened_bf16_products reads them split into even and odd columns.
  const bool reads_f32_rows = !d.transposed || d.interleaved || !has_bf16_dot_rows<X, W>();
  const bool widens_bf16 = widens_bf16_products<X, W>(d);
  const float* x = nullptr;
  if constexpr (std::is_same_v<X, float>) {
    x = inp;
  } else if (reads_f32_rows) {
    float* rows = thread_scratch<InputRows, float>(d.N * d.C);
    for (int64_t i = 0; i < d.N * d.C; ++i) rows[i] = to_float(inp[i]);
    x = rows;
  } else if (widens_bf16) {
    float* rows = thread_scratch<InputRows, float>(d.N * split_row_length(d.C));
    split_bf16_rows(rows, reinterpret_cast<const uint16_t*>(inp), d.N, d.C);
    x = rows;
  }
  typename Packed::Rows* x_blocks = nullptr;
  typename Packed::TileTerms x_tile_terms{};
  if constexpr (packed_weights) {
    using Rows = typename Packed::Rows;
    x_blocks = thread_scratch<QuantizedRows, Rows>(d.N * d.C / Rows::kElements);
    Packed::quantize_rows(x, x_blocks, d.N * d.C);
    if constexpr (Packed::kTiles) {
      if (d.tiled) x_tile_terms = Packed::tile_terms(x_blocks, d.N * d.C / Rows::kElements);
    }
  }
  uint16_t* half_x = nullptr;
  float* unscale = nullptr;
  if (half_arithmetic) {
    half_x = thread_scratch<HalfInputRows, uint16_t>(d.N * half_row_length(d.C));
    unscale = thread_scratch<RowUnscales, float>(d.N);
    half_rows(half_x, unscale, x, d.N, d.C);
  }
  // Outputs (weight rows of out_in, columns of in_out) in shares that are multiples of 16. An
  // [out, in] weight's rows go in shares of 16-256 (at least four per thread), handed to threads
  // as they ask, so that a thread slowed by another process on its core takes fewer instead of
  // keeping the others waiting (shares of at most 64 made a 32-sequence decoding step 5% slower:
  // more, shorter weight streams); in_out's columns, whose every pass reads all C weight rows, in
  // at most one share per thread. A single row, which only streams the weight from memory, in one
  // share per thread too: one long stream each reads ~3% faster than shares taken in turns.
  const int threads = omp_get_max_threads();
  const int64_t one_share_each = std::max<int64_t>(1, ((d.OC + 15) / 16 + threads - 1) / threads) * 16;
  const int64_t share = d.transposed && d.N > 1 ? std::clamp<int64_t>(d.OC / (4 * threads) / 16 * 16, 16, 256)
                                                : one_share_each;
  const int64_t shares = (d.OC + share - 1) / share;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t index = 0; index < shares; ++index) {
    const int64_t begin = index * share, end = std::min(d.OC, begin + share), width = end - begin;
    // f32 outputs of an [out, in] product with no bias or GELU to add (the head's logits) are
    // summed in place: no copy of N x OC floats from a scratch buffer.
    float* sums = nullptr;
    if constexpr (std::is_same_v<Out, float>) {
      if (d.transposed && !gelu && bias == nullptr) sums = out + begin;
    }
    const bool in_place = sums != nullptr;
    if (!in_place) sums = thread_scratch<OutputSums, float>(d.N * share);
    const int64_t sums_ld = in_place ? d.OC : width;
    if constexpr (packed_weights) {
      // A tiled weight's whole groups by the tile products, the rows after them as [out, in] rows.
      int64_t rows_begin = begin;
      if constexpr (Packed::kTiles) {
        if (d.tiled) {
          rows_begin = std::clamp(d.OC / kQuantizedTileRows * kQuantizedTileRows, begin, end);
          Packed::tile_dot_rows(sums, sums_ld, x_blocks, x_tile_terms, d.N, d.C, reinterpret_cast<const uint8_t*>(weight),
                                begin, rows_begin);
        }
      }
      Packed::dot_rows(sums + (rows_begin - begin), sums_ld, x_blocks, d.N, d.C, weight, rows_begin, end);
    } else if (!d.transposed) {
      std::fill(sums, sums + d.N * width, 0.0f);
      // Four weight rows per pass over the sums: one load and store of each sum per four FMAs.
      int64_t c = 0;
      for (; c + 4 <= d.C; c += 4) {
        const W *w0 = weight + c * d.OC, *w1 = w0 + d.OC, *w2 = w1 + d.OC, *w3 = w2 + d.OC;
        for (int64_t n = 0; n < d.N; ++n) {
          const float* xn = x + n * d.C + c;
          const float x0 = xn[0], x1 = xn[1], x2 = xn[2], x3 = xn[3];
          float* acc = sums + n * width - begin;
#pragma omp simd
          for (int64_t o = begin; o < end; ++o) {
            acc[o] += x0 * to_float(w0[o]) + x1 * to_float(w1[o]) + x2 * to_float(w2[o]) + x3 * to_float(w3[o]);
          }
        }
      }
      for (; c < d.C; ++c) {
        const W* row = weight + c * d.OC;
        for (int64_t n = 0; n < d.N; ++n) {
          const float xc = x[n * d.C + c];
          float* acc = sums + n * width - begin;
#pragma omp simd
          for (int64_t o = begin; o < end; ++o) acc[o] += xc * to_float(row[o]);
        }
      }
    } else if (half_arithmetic) {
      half_products(sums, sums_ld, half_x, unscale, x, d.N, d.C, reinterpret_cast<const uint16_t*>(weight), d.OC, begin,
                    end);
    } else if (widens_bf16) {
      widened_bf16_products(sums, sums_ld, x, d.N, d.C, reinterpret_cast<const uint16_t*>(weight), begin, end);
    } else if (bf16_dot_rows_apply(sums, sums_ld, inp, weight, d, begin, end)) {
#if defined(__AVX2__) && defined(__FMA__)
    } else if constexpr (std::is_same_v<W, float> || std::is_same_v<W, BFloat16> || std::is_same_v<W, Float16>) {
      f32_dot_rows(sums, sums_ld, x, weight, d, begin, end);
#endif
    } else {
      for (int64_t o = begin; o < end; ++o) {
        const W* row = weight + o * d.C;
        for (int64_t n = 0; n < d.N; ++n) {
          const float* xn = x + n * d.C;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d.C; ++c) dot += xn[c] * to_float(row[c]);
          sums[n * sums_ld + (o - begin)] = dot;
        }
      }
    }
    for (int64_t n = 0; n < d.N && !in_place; ++n) {
      const float* acc = sums + n * width;
      Out* out_row = out + n * d.OC + begin;
      Slope* slope_row = slope != nullptr ? slope + n * d.OC + begin : nullptr;
      const float* bias_part = bias != nullptr ? bias + begin : nullptr;
      auto finish = [&]<bool Gelu, bool KeepSlope>() {
        if (bias_part != nullptr) finish_row<Gelu, true, KeepSlope>(out_row, slope_row, acc, bias_part, width);
        else finish_row<Gelu, false, KeepSlope>(out_row, slope_row, acc, bias_part, width);
      };
      if (!gelu) finish.template operator()<false, false>();
      else if (slope_row != nullptr) finish.template operator()<true, true>();
      else finish.template operator()<true, false>();
    }
  }
}

// small_rows_matmul over all of args' rows, in passes of at most kRowsPerPass, so that the
// per-thread sums it keeps stay small (an [in, out] weight's outputs are shared out among the
// threads whole: 1024 rows by a 50257-wide one would hold 200 MB of them for the life of the
// process). Each of its kernels sums a row alike whatever rows share the pass, so passes change
// no result.
template <typename X, typename W, typename Out>
void small_rows_matmul_in_passes(const MatmulForward& args, const MatmulDims& d) {
  constexpr int64_t kRowsPerPass = 64;
  Out *out = pointer<Out>(args.out), *slope = args.gelu ? pointer<Out>(args.gelu_slope) : nullptr;  // may be null
  const X* inp = pointer<X>(args.inp);
  for (int64_t first = 0; first < d.N; first += kRowsPerPass) {
    MatmulDims part = d;
    part.N = std::min(kRowsPerPass, d.N - first);
    small_rows_matmul(out + first * d.OC, slope != nullptr ? slope + first * d.OC : nullptr, inp + first * d.C,
                      pointer<W>(args.weight), pointer<float>(args.bias), part, args.gelu);
  }
}

// Where a forward GEMM writes its product: with GELU into the slope's rows, which the GELU pass
// turns into the slope (or, with no slope kept, into out's own rows); else into out.
const Tensor& product_destination(const MatmulForward& args) {
  return args.gelu && args.gelu_slope.defined() ? args.gelu_slope : args.out;
}

// GELU's backward pass multiplies by the slope its forward pass kept.
void check_slope_kept(const MatmulBackward& args) {
  check(!args.gelu || args.gelu_slope.defined(),
        "matmul backward with GELU: no gelu_slope (its forward pass kept none, as for decoding)");
}

}  // namespace

void matmul_forward(const MatmulForward& args) {
  const MatmulDims d = dims_of(args, args.out);
  if (args.weight.dtype() == DType::f16) {  // decoding's float16 weights: any number of rows, row-invariant
    small_rows_matmul_in_passes<float, Float16, float>(args, d);
    return;
  }
  const float *inp = pointer<float>(args.inp), *weight = pointer<float>(args.weight);
  const float* bias = pointer<float>(args.bias);
  if (d.N <= kSmallRows || args.row_invariant || d.stored_for_decoding()) {
    small_rows_matmul_in_passes<float, float, float>(args, d);
    return;
  }
  float* target = pointer<float>(product_destination(args));
  // The bias is added in a second pass: oneDNN's matmul primitive with the bias in its write-back
  // ran the 124M shape's forward GEMMs 1.4x slower than sgemm and the pass (bench/RESULTS.md).
  sgemm(false, d.transposed, d.N, d.OC, d.C, 1.0f, inp, d.C, weight, d.weight_ld(), 0.0f, target, d.OC);
  if (bias != nullptr || args.gelu) bias_and_gelu(pointer<float>(args.out), target, bias, args.gelu, d.N, d.OC);
}

template <typename Block>
void matmul_forward_blocks(const MatmulForward& args) {
  small_rows_matmul_in_passes<float, Block, float>(args, dims_of(args, args.out));
}
template void matmul_forward_blocks<BlockQ8_0>(const MatmulForward& args);
template void matmul_forward_blocks<BlockQ4_K>(const MatmulForward& args);
template void matmul_forward_blocks<BlockQ5_0>(const MatmulForward& args);

void matmul_backward(const MatmulBackward& args) {
  const MatmulDims d = dims_of(args, args.dout);
  check_slope_kept(args);
  check(args.weight.dtype() == DType::f32, "matmul backward: {} weights are for decoding (forward only)",
        dtype_name(args.weight.dtype()));
  check(!d.stored_for_decoding(), "matmul backward: out_in_interleaved and out_in_tiles weights are for decoding (forward only)");
  const float *inp = pointer<float>(args.inp), *weight = pointer<float>(args.weight);
  float* dout = pointer<float>(args.dout);
  // With GELU dout becomes the pre-activation gradient in place; the bias gradient is summed in the
  // same pass (which, without GELU, only reads dout).
  if (args.gelu) {
    output_gradient(pointer<float>(args.dbias), dout, dout, pointer<float>(args.gelu_slope), d.N, d.OC);
  } else if (args.dbias.defined()) {
    output_gradient(pointer<float>(args.dbias), dout, static_cast<float*>(nullptr), static_cast<const float*>(nullptr),
                    d.N, d.OC);
  }
  if (args.dinp.defined()) {
    // dinp (N,C) (+)= dout (N,OC) · W^T
    sgemm(false, !d.transposed, d.N, d.C, d.OC, 1.0f, dout, d.OC, weight, d.weight_ld(),
          args.accumulate_dinp ? 1.0f : 0.0f, pointer<float>(args.dinp), d.C);
  }
  if (!args.dweight.defined()) return;  // a weight that takes no gradient
  const float beta = args.accumulate_dweight ? 1.0f : 0.0f;
  if (d.transposed) {
    // dW [OC,C] (+)= dout^T · inp
    sgemm(true, false, d.OC, d.C, d.N, 1.0f, dout, d.OC, inp, d.C, beta, pointer<float>(args.dweight), d.C);
  } else {
    // dW [C,OC] (+)= inp^T · dout
    sgemm(true, false, d.C, d.OC, d.N, 1.0f, inp, d.C, dout, d.OC, beta, pointer<float>(args.dweight), d.OC);
  }
}

// bf16 operands (inp, weight); out f32 or bf16, and gelu_slope (with GELU) of out's type. Without
// native bf16 arithmetic every product takes the row-streaming kernel, which widens bf16 in
// registers (oneDNN would emulate its bf16 GEMM more slowly).
void matmul_forward_bf16(const MatmulForward& args) {
  const MatmulDims d = dims_of(args, args.out);
  const auto *inp = pointer<uint16_t>(args.inp), *weight = pointer<uint16_t>(args.weight);
  static const bool native_bf16 = has_native_bf16();
  if (d.N <= kSmallRows || args.row_invariant || d.stored_for_decoding() || !native_bf16) {
    if (args.out.dtype() == DType::bf16) small_rows_matmul_in_passes<BFloat16, BFloat16, BFloat16>(args, d);
    else small_rows_matmul_in_passes<BFloat16, BFloat16, float>(args, d);
    return;
  }
  const Tensor& target = product_destination(args);
  gemm_bf16(false, d.transposed, d.N, d.OC, d.C, inp, d.C, weight, d.weight_ld(), pointer<float>(args.bias), false,
            target.device_address(), target.dtype(), d.OC);
  if (!args.gelu) return;
  if (args.out.dtype() == DType::bf16) {
    bias_and_gelu(pointer<BFloat16>(args.out), pointer<BFloat16>(target), nullptr, true, d.N, d.OC);
  } else {
    bias_and_gelu(pointer<float>(args.out), pointer<float>(target), nullptr, true, d.N, d.OC);
  }
}

// bf16 operands (inp, weight); dout f32 or bf16; dinp and dweight f32 or bf16 (the gradients of
// inp and of the weight's bf16 copy).
void matmul_backward_bf16(const MatmulBackward& args) {
  const MatmulDims d = dims_of(args, args.dout);
  check_slope_kept(args);
  check(!d.stored_for_decoding(), "matmul backward: out_in_interleaved and out_in_tiles weights are for decoding (forward only)");
  const auto *inp = pointer<uint16_t>(args.inp), *weight = pointer<uint16_t>(args.weight);
  // The GEMMs' operand: dout itself when it is bf16 and nothing applies to it, else a bf16 copy
  // made in the pass that applies the GELU's derivative and sums the bias gradient.
  const uint16_t* grad = nullptr;
  const bool bf16_dout = args.dout.dtype() == DType::bf16;
  if (bf16_dout && !args.gelu) {
    grad = pointer<uint16_t>(args.dout);
    if (args.dbias.defined()) {
      output_gradient(pointer<float>(args.dbias), pointer<BFloat16>(args.dout), static_cast<BFloat16*>(nullptr),
                      static_cast<const float*>(nullptr), d.N, d.OC);
    }
  } else {
    auto* scratch = thread_scratch<GradientOperand, BFloat16>(d.N * d.OC);
    if (bf16_dout) {
      output_gradient(pointer<float>(args.dbias), pointer<BFloat16>(args.dout), scratch,
                      pointer<BFloat16>(args.gelu_slope), d.N, d.OC);
    } else {
      output_gradient(pointer<float>(args.dbias), pointer<float>(args.dout), scratch, pointer<float>(args.gelu_slope),
                      d.N, d.OC);
    }
    grad = reinterpret_cast<const uint16_t*>(scratch);
  }
  if (args.dinp.defined()) {
    gemm_bf16(false, !d.transposed, d.N, d.C, d.OC, grad, d.OC, weight, d.weight_ld(), nullptr, args.accumulate_dinp,
              args.dinp.device_address(), args.dinp.dtype(), d.C);
  }
  if (!args.dweight.defined()) return;  // a weight that takes no gradient
  if (d.transposed) {
    gemm_bf16(true, false, d.OC, d.C, d.N, grad, d.OC, inp, d.C, nullptr, args.accumulate_dweight,
              args.dweight.device_address(), args.dweight.dtype(), d.C);
  } else {
    gemm_bf16(true, false, d.C, d.OC, d.N, inp, d.C, grad, d.OC, nullptr, args.accumulate_dweight,
              args.dweight.device_address(), args.dweight.dtype(), d.OC);
  }
}

}  // namespace paraflow::cpu
