// Row-invariant products of Q4_K weights (tensor/quantized.h), read as packed super-blocks:
// decoding's weight stream is 4.5 bits per weight. As llama.cpp does, the input rows are quantized
// to Q8_K (256 int8 and one float scale per super-block), so that each super-block pair is
// sum_j scale_j * (q4_j . q8_j) in int32 (AVX512_VNNI or AVX_VNNI vpdpbusd, else AVX2's
// vpmaddubsw; the plain C++ path where the build has no AVX2), minus dmin-scaled sum_j min_j *
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

}  // namespace paraflow::cpu
