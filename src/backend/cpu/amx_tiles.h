// Row-invariant bf16 products on AMX tiles: sums[n][o] = x[n] · w[o] for a bf16 weight stored
// out_in_tiles (backend/kernel_args.h). The input rows load straight into A tiles, the weight's
// 1 KiB tiles into B tiles, and the product tile is [input row][output], stored as it is. Each
// output element is one element of a tile product, accumulated over the same 32-column chunks in
// the same order whatever the number of rows: a row's result does not depend on its batch, as
// with the vdpbf16ps kernel, at AMX's speed.
#pragma once

#include <cstdint>

namespace paraflow::cpu {

// AMX-BF16 compiled in, present, and granted to the process by the kernel (arch_prctl).
bool amx_tiles_available();

// sums[n * sums_ld + (o - begin)] for the rows x[0, rows) (row-major, `columns` apart) and the
// weight's output rows [begin, end), both multiples of 16 (columns a multiple of 32). Called by
// each thread on its own share of the outputs.
void amx_tile_products(float* sums, int64_t sums_ld, const uint16_t* x, int64_t rows, int64_t columns,
                       const uint16_t* weight, int64_t begin, int64_t end);

}  // namespace paraflow::cpu
