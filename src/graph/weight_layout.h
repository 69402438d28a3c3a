// A layout pass for decoding: at batch 1 each token reads every weight once, and the few-rows
// matmul kernel reads an [out, in] weight as one contiguous row per output (a dot product, where
// AVX512_BF16 multiplies bf16 pairs directly). This pass stores the given [in, out] matmul
// weights transposed, for graphs that only run forward; the caller binds transposed copies.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace paraflow::graph {

// Each of `weights` read only as the weight of in_out matmuls becomes an [out, in] value read
// with layout out_in. Returns those it changed.
std::vector<ValueId> transpose_matmul_weights(Graph& graph, const std::vector<ValueId>& weights);

}  // namespace paraflow::graph
