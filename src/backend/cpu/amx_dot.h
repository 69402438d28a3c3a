// Row-invariant bf16 dot products on AMX tiles: sums[n][o] = x[n] · w[o] for an [out, in] bf16
// weight, computed as (W · Xᵀ) so the weight rows load straight into A tiles and only the few
// input rows are repacked (into the pair-interleaved B layout). Each output element is one
// element of a tile product, accumulated over the same 32-column chunks in the same order
// whatever the number of rows: a row's result does not depend on its batch, as with the
// vdpbf16ps kernel, at AMX's speed.
#pragma once

#include <cstdint>
#include <vector>

namespace paraflow::cpu {

// AMX-BF16 compiled in, present, and granted to the process by the kernel (arch_prctl).
bool amx_dot_available();

// The input rows in B-tile layout: per 32-column chunk and block of 16 rows, 16 column pairs
// by 16 rows, zero beyond N. C must be a multiple of 32.
struct AmxRows {
  std::vector<uint16_t> packed;
  int64_t rows = 0, columns = 0, row_blocks = 0;
};
AmxRows pack_amx_rows(const uint16_t* x, int64_t rows, int64_t columns);

// sums[n * sums_ld + (o - begin)] for weight rows [begin, end), both multiples of 16 (C a
// multiple of 32). Called by each thread on its own share of the outputs.
void amx_dot_rows(float* sums, int64_t sums_ld, const AmxRows& x, const uint16_t* weight, int64_t begin, int64_t end);

}  // namespace paraflow::cpu
