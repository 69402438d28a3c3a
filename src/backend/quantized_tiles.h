// out_in_tiles for block-quantized weights (Q8_0, Q5_0 and Q4_K): the [rows, columns] weight's rows in
// groups of 16, each group's bytes (16 rows of blocks) rearranged so that one 64-byte load holds
// four consecutive weights of each of the 16 rows, what one AVX512_VNNI vpdpbusd multiplies by
// four input values broadcast: 16 outputs' int32 block sums come whole out of eight (Q8_0, Q5_0)
// or 64 (Q4_K) such products, with no horizontal sums (the [out, in] rows' kernel sums lanes per
// output and block). Rows after the last whole group stay as in out_in. A group holds, for
// `blocks` blocks per row:
// - Q8_0: the values, block b's four-value step s (0-7) of row r at ((b * 8 + s) * 16 + r) * 4,
//   each stored as q + 128 (q xor 0x80: vpdpbusd's unsigned operand); then the scales, block b's
//   of row r at 16 * blocks * 32 + (b * 16 + r) * 2.
// - Q5_0: the low nibbles, block b's qs[4 s + i] (s 0-3, i 0-3; as in the block: the low nibble
//   weight 4 s + i's, the high one weight 16 + 4 s + i's) of row r at ((b * 4 + s) * 16 + r) * 4 + i;
//   then the top bits, as a 64-bit mask per block b and four-weight step k (0-7) at 16 * blocks * 16
//   + (b * 8 + k) * 8, bit 4 r + i the top bit of weight 4 k + i of row r; then the scales, block
//   b's of row r at 16 * blocks * 20 + (b * 16 + r) * 2.
// - Q4_K: the packed nibbles, super-block b's qs[32 p + 4 s + i] (p 0-3, s 0-7, i 0-3) of row r
//   at (((b * 4 + p) * 8 + s) * 16 + r) * 4 + i (as in the block: the low nibble weight 64 p + 4 s
//   + i, the high one 32 later); then per super-block 256 bytes at 16 * blocks * 128 + b * 256:
//   the 16 rows' d (f16), their dmin, and each of the 12 packed scale bytes t for the 16 rows at
//   64 + 16 t + r.
// The group takes exactly the bytes of its 16 rows of blocks.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace paraflow {

constexpr int64_t kQuantizedTileRows = 16;

// Whether `dtype` has this layout (Q8_0, Q5_0 and Q4_K).
bool has_quantized_tiles(DType dtype);

// Rearranges `data`, a [rows, columns] weight of `dtype` blocks in out_in (row after row), into
// out_in_tiles, in place.
void tile_quantized_rows(DType dtype, void* data, int64_t rows, int64_t columns);

}  // namespace paraflow
