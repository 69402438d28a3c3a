// The input rows of a block-quantized product, quantized as tensor/quantized.h's quantize_q8_0 and
// quantize_q8_k do, bit for bit, with AVX-512 where the build has it (a block in two or sixteen
// vector operations instead of one value at a time): a serving step quantizes every linear
// layer's input rows, on the calling thread, before the weights' products start.
#pragma once

#include <cstdint>

#include "tensor/quantized.h"

namespace paraflow::cpu {

void quantize_rows_q8_0(const float* values, BlockQ8_0* blocks, int64_t count);
void quantize_rows_q8_k(const float* values, BlockQ8_K* blocks, int64_t count);

}  // namespace paraflow::cpu
