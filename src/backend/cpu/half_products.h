// Row-invariant products in half-precision arithmetic: sums[n][o] = x[n] · w[o] for f32 input
// rows and an [out, in] float16 weight, on CPUs with AVX512_FP16, whose 32-lane half FMAs issue at
// the rate of 16-lane f32 ones: twice the multiply-adds per instruction. That is what a step of
// many decoding sequences is bound by on a CPU without AMX (bench/RESULTS.md: a 32-sequence step of
// GPT-2 124M is 4 GMAC).
//
// Each input row is scaled by a power of two so that its largest magnitude lies in [16, 32)
// (exact: only the exponent changes), rounded to half, and multiplied by the weight in 32-column
// chunks; each lane sums kHalfChunksPerSum chunks in half precision, then adds that partial sum
// to an f32 one, and the 16 f32 lanes are added in a fixed order at the end. Every output's sum
// so runs in one order whatever the number of rows or threads: a row's result does not depend on
// its batch. An output whose half partial sums overflowed (not finite) is summed again in f32
// from the f32 row, as is one whose row holds a NaN or an infinity: the scale keeps products of
// weights below ~80 in range, so only outlandish weights take that path.
//
// Error: a lane's half sum rounds at each of its kHalfChunksPerSum FMAs and the input once, so an
// output differs from the exact product of the f32 input and the half weight by at most
// half_products_error_bound() (per element: (kHalfChunksPerSum + 1) half units of roundoff times
// |x_c w_c|, plus half's subnormal spacing per product); tests/backend/ops_test.cc checks it.
#pragma once

#include <cstdint>

namespace paraflow::cpu {

// Chunks of 32 columns a lane sums in half precision before adding the result in f32: 24 makes
// one f32 addition per lane for GPT-2 124M's 768 columns. Flushing every 8 chunks instead cost a
// third of the speed (a throwaway kernel in L1; bench/RESULTS.md).
constexpr int64_t kHalfChunksPerSum = 24;

// Whether this build has the kernel (compiled with AVX512_FP16).
bool has_half_products();

// The row stride, in halves, of half_rows' output for rows of `columns` values.
int64_t half_row_length(int64_t columns);

// rows x columns f32 values (row-major) into half rows of half_row_length(columns), each row
// scaled by a power of two as above, the last chunk zero-padded; unscale[n] is the inverse of row
// n's scale, which half_products multiplies its sums by.
void half_rows(uint16_t* half, float* unscale, const float* x, int64_t rows, int64_t columns);

// sums[n * sums_ld + (o - begin)] = x[n] · weight[o] for rows [0, rows) and the weight's output
// rows [begin, end) (each `columns` long, IEEE half), from half_rows' output (`half_x`, `unscale`)
// and the f32 rows themselves (`x`, for outputs whose half sums overflowed). Called by each thread
// on its own share of the outputs.
void half_products(float* sums, int64_t sums_ld, const uint16_t* half_x, const float* unscale, const float* x,
                   int64_t rows, int64_t columns, const uint16_t* weight, int64_t begin, int64_t end);

// The bound above on |computed - x · w| for one output, given sum_abs = Σ_c |x_c w_c| (in f32
// terms) and the row's unscale.
double half_products_error_bound(double sum_abs, double unscale, int64_t columns);

}  // namespace paraflow::cpu
