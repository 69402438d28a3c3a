// Row-invariant products of Q8_0 and Q5_0 weights (tensor/quantized.h), read as packed blocks:
// decoding's weight stream is 8.5 or 5.5 bits per weight instead of bf16's 16. As llama.cpp does,
// the input rows are quantized to Q8_0 blocks (the same reference quantizer), so that each block
// pair is 32 int8 products (a Q5_0 weight's q - 16 is an int8 too) summed in int32 (AVX512_VNNI or AVX_VNNI vpdpbusd, else AVX2's vpmaddubsw and
// vpmaddwd), then scaled by the two blocks' scales into an f32 sum. Each output sums its blocks in
// order, in fixed lanes, whatever the number of rows or threads: a row's result does not depend on
// its batch.
#pragma once

#include <cstdint>

#include "tensor/quantized.h"

namespace paraflow::cpu {

// sums[n * sums_ld + (o - begin)] = x[n] · weight[o] for weight rows [begin, end): x (N rows of
// C / 32 blocks) and weight ([out, in] rows of C / 32 blocks) both Q8_0, C a multiple of 32.
void q8_0_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, int64_t N, int64_t C, const BlockQ8_0* weight,
                   int64_t begin, int64_t end);
// The same with Q5_0 weights.
void q5_0_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, int64_t N, int64_t C, const BlockQ5_0* weight,
                   int64_t begin, int64_t end);

// Whether this build multiplies Q8_0, Q5_0 and Q4_K weights stored out_in_tiles
// (backend/quantized_tiles.h): AVX512_VNNI's 512-bit vpdpbusd.
constexpr bool has_quantized_tile_products() {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return true;
#else
  return false;
#endif
}

// What the tile products read of the Q8_0 input rows beside their blocks: each block's scale in
// f32, and the sum of its values (the weights are stored as unsigned levels: that sum times their
// offset takes it back). Computed once per product by q8_0_tile_terms, in storage of the calling
// thread's kept until its next call.
struct Q8_0TileTerms {
  const float* scales;
  const int32_t* sums;
};
Q8_0TileTerms q8_0_tile_terms(const BlockQ8_0* x, int64_t blocks);

// q8_0_dot_rows and q5_0_dot_rows for a weight stored out_in_tiles (`tiles` its first byte), weight
// rows [begin, end) of its whole groups (begin and end multiples of 16). Each output's sum is its
// own: per block the exact int32 sum of the 32 products, then one FMA of it times the two blocks'
// scales' product, in block order, whatever the number of rows or threads.
void q8_0_tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, const Q8_0TileTerms& terms, int64_t N,
                        int64_t C, const uint8_t* tiles, int64_t begin, int64_t end);
void q5_0_tile_dot_rows(float* sums, int64_t sums_ld, const BlockQ8_0* x, const Q8_0TileTerms& terms, int64_t N,
                        int64_t C, const uint8_t* tiles, int64_t begin, int64_t end);

}  // namespace paraflow::cpu
