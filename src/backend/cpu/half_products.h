// Row-invariant products in half-precision arithmetic: sums[n][o] = x[n] · w[o] for f32 input
// rows and a float16 weight stored out_in_tiles (backend/kernel_args.h), on CPUs with AVX512_FP16,
// whose 32-lane half FMAs issue at the rate of 16-lane f32 ones: twice the multiply-adds per
// instruction. That is what a step of many decoding sequences is bound by on a CPU without AMX
// (bench/RESULTS.md: a 32-sequence step of GPT-2 124M is 4 GMAC).
//
// Each input row is scaled by a power of two so that its largest magnitude lies in [16, 32)
// (exact: only the exponent changes) and rounded to half. The weight's groups of 16 rows hold, per
// pair of columns, the 16 rows' two values side by side: one 32-lane register, which a broadcast
// pair of input values multiplies (outer products: no lane sums across columns). Each lane (an
// output's even or odd columns) sums kHalfPairsPerSum pairs in half precision, then adds that
// partial sum to an f32 one; an output is its two lanes added. Every output's sum so runs in one
// order whatever the number of rows or threads: a row's result does not depend on its batch. An
// output whose half partial sums overflowed (not finite) is summed again in f32 from the f32 row,
// as is one whose row holds a NaN or an infinity (the scale keeps products of weights below ~80 in
// range, so only outlandish weights take that path), and so are the rows after the last group.
//
// Error: a lane's half sum rounds at each of its kHalfPairsPerSum FMAs and the input once, so an
// output differs from the exact product of the f32 input and the half weight by at most
// half_products_error_bound() (per element: (kHalfPairsPerSum + 1) half units of roundoff times
// |x_c w_c|, plus half's subnormal spacing per product); tests/backend/ops_test.cc checks it.
#pragma once

#include <cstdint>

namespace paraflow::cpu {

// Column pairs a lane sums in half precision before adding the result in f32, and the pairs of
// a weight tile (16 rows x 128 columns, 4 KiB per group) that stays in L1 while every block of
// input rows passes by. 64 with these tiles ran a 32-row product 1.1-1.3x faster than
// without tiles; 32 and 128 measured within noise of it (bench/RESULTS.md).
constexpr int64_t kHalfPairsPerSum = 64;

// Whether this build has the kernel (compiled with AVX512_FP16).
bool has_half_products();

// The row stride, in halves, of half_rows' output for rows of `columns` values.
int64_t half_row_length(int64_t columns);

// rows x columns f32 values (row-major) into half rows of half_row_length(columns), each row
// scaled by a power of two as above, zero-padded; unscale[n] is the inverse of row n's scale,
// which half_products multiplies its sums by.
void half_rows(uint16_t* half, float* unscale, const float* x, int64_t rows, int64_t columns);

// sums[n * sums_ld + (o - begin)] = x[n] · weight[o] for rows [0, rows) and the weight's output
// rows [begin, end) (begin a multiple of 16), the weight [weight_rows, columns] float16 stored
// out_in_tiles with `columns` even, from half_rows' output (`half_x`, `unscale`) and the f32 rows
// themselves (`x`). Called by each thread on its own share of the outputs.
void half_products(float* sums, int64_t sums_ld, const uint16_t* half_x, const float* unscale, const float* x,
                   int64_t rows, int64_t columns, const uint16_t* weight, int64_t weight_rows, int64_t begin,
                   int64_t end);

// The bound above on |computed - x · w| for one output, given sum_abs = Σ_c |x_c w_c| (in f32
// terms) and the row's unscale.
double half_products_error_bound(double sum_abs, double unscale, int64_t columns);

}  // namespace paraflow::cpu
