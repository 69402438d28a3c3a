// Row-invariant bf16 products with f32 FMAs: sums[n][o] = x[n] · w[o] for bf16 input rows and an
// [out, in] bf16 weight, on CPUs whose bf16 dot-product instruction (vdpbf16ps) runs at half the
// rate of f32 FMAs (an Intel Xeon without AMX: bench/RESULTS.md). Each 32-column chunk of a weight
// row is widened in registers into two f32 vectors, its even columns and its odd ones (a shift
// and a mask of the same 32-bit lanes: no shuffle), and multiplied by the input row's matching
// halves, split once per call (split_bf16_rows). The products are exact (bf16 times bf16 fits
// f32's mantissa) and every output sums its chunks in the same order whatever the number of rows
// or threads: a row's result does not depend on its batch, as with the vdpbf16ps kernel.
#pragma once

#include <cstdint>

namespace paraflow::cpu {

// The row stride, in floats, of split_bf16_rows' output for rows of `columns` bf16 values.
int64_t split_row_length(int64_t columns);

// rows x columns bf16 values (row-major) into f32 rows of split_row_length(columns): per 32-column
// chunk, its 16 even columns and then its 16 odd ones, the last chunk zero-padded.
void split_bf16_rows(float* split, const uint16_t* x, int64_t rows, int64_t columns);

// sums[n * sums_ld + (o - begin)] = x[n] · weight[o] for the split rows x[0, rows) and the
// weight's output rows [begin, end) (each `columns` long). Called by each thread on its own share
// of the outputs.
void widened_bf16_products(float* sums, int64_t sums_ld, const float* split_x, int64_t rows, int64_t columns,
                           const uint16_t* weight, int64_t begin, int64_t end);

}  // namespace paraflow::cpu
