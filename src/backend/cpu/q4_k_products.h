// Row-invariant products of Q4_K weights (tensor/quantized.h), read as packed super-blocks:
// decoding's weight stream is 4.5 bits per weight. As llama.cpp does, the input rows are quantized
// to Q8_K (256 int8 and one float scale per super-block), so that each super-block pair is
// sum_j scale_j * (q4_j . q8_j) in int32 (AVX2's vpmaddubsw, then AVX512_VNNI's or AVX_VNNI's
// vpdpwssd, else vpmaddwd; the plain C++ path where the build has no AVX2), minus dmin-scaled sum_j min_j *
// sum(q8_j), both then scaled into f32 sums. Each output sums its super-blocks in order, in fixed
// lanes, whatever the number of rows or threads: a row's result does not depend on its batch.
#pragma once

#include <cstdint>

#include "tensor/quantized.h"

namespace paraflow::cpu {

// sums[n * sums_ld + (o - begin)] = x[n] . weight[o] for weight rows [begin, end): x (N rows of
// C / 256 Q8_K blocks) and weight ([out, in] rows of C / 256 Q4_K blocks), C a multiple of 256.
void q4_k_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_K* x, int64_t N, int64_t C, const BlockQ4_K* weight,
                   int64_t begin, int64_t end);

// What the tile products read of the input rows beside their blocks: each super-block's
// sub-block sums (of 32 values) in int16 pairs, sub-blocks 2q and 2q + 1 (the minimums multiply
// them). Computed once per product by q4_k_tile_terms, in storage of the calling thread's kept
// until its next call.
struct Q4_KTileTerms {
  const int32_t* sum_pairs;
};
Q4_KTileTerms q4_k_tile_terms(const BlockQ8_K* x, int64_t blocks);

// q4_k_dot_rows for a weight stored out_in_tiles (`tiles` its first byte; backend/quantized_tiles.h),
// weight rows [begin, end) of its whole groups (multiples of 16), where the build has
// AVX512_VNNI (q8_0_products.h: has_quantized_tile_products). Each output's sum is its own: per
// super-block the exact int32 sums sum_j scale_j * (q4_j . q8_j) and sum_j min_j * sum(q8_j),
// then two FMAs (the first times d, the second subtracted times dmin, each scaled by the row's
// d), in super-block order, whatever the number of rows or threads.
void q4_k_tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_K* x, const Q4_KTileTerms& terms, int64_t N,
                        int64_t C, const uint8_t* tiles, int64_t begin, int64_t end);

}  // namespace paraflow::cpu
