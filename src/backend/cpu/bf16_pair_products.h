// Row-invariant bf16 products without AMX: sums[n][o] = x[n] · w[o] for bf16 input rows and a
// bf16 weight stored out_in_tiles (backend/kernel_args.h), on AVX512_BF16's vdpbf16ps. A column
// pair of a group of 16 weight rows is one 32-lane register; a broadcast pair of input values
// times it adds, in each of 16 f32 lanes, one output's two products (outer products: no lane sums
// across columns, and each group is one contiguous stream). An output's sum runs over the column
// pairs in order whatever the number of rows or threads: a row's result does not depend on its
// batch. For CPUs whose vdpbf16ps issues at the f32 FMA rate (AMD's Zen 4), where the [out, in]
// rows' dot products read four weight rows at once and streamed batch-1 decoding's weights at
// less than half the memory's rate (bench/RESULTS.md).
#pragma once

#include <cstdint>

namespace paraflow::cpu {

// sums[n * sums_ld + (o - begin)] for the rows x[0, rows) (row-major, `columns` apart) and the
// weight's output rows [begin, end), both multiples of 16, `columns` even. Called by each thread
// on its own share of the outputs. Throws where the build has no AVX512_BF16 code.
void bf16_pair_products(float* sums, int64_t sums_ld, const uint16_t* x, int64_t rows, int64_t columns,
                        const uint16_t* weight, int64_t begin, int64_t end);

}  // namespace paraflow::cpu
