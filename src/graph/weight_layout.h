// Layout passes for decoding: at batch 1 each token reads every weight once, and the few-rows
// matmul kernel reads an [out, in] weight as one contiguous row per output (a dot product, where
// AVX512_BF16 multiplies bf16 pairs directly), or, where the backend prefers it, sixteen rows at
// a time from one interleaved stream (outer products), or, on AMX, as whole 1 KiB tiles of 16
// rows by 32 columns (tile products; float16 weights take that layout too, for half-precision
// outer products of column pairs). These passes change the given weights'
// layouts in graphs that only run forward; the caller binds copies stored that way.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"

namespace paraflow::graph {

// Each of `weights` read only as the weight of in_out matmuls becomes an [out, in] value read
// with layout out_in. Returns those it changed.
std::vector<ValueId> transpose_matmul_weights(Graph& graph, const std::vector<ValueId>& weights);

// Each of `weights` read only as the weight of forward out_in matmuls, or as the table of forward
// embeddings, is read out_in_interleaved where `backend` prefers that for its dtype
// (Backend::prefers_interleaved_weights). Returns those it changed.
std::vector<ValueId> interleave_weights(Graph& graph, const std::vector<ValueId>& weights, const Backend& backend);

// Each of `weights` read only as the weight of forward out_in matmuls is read out_in_tiles where
// `backend` prefers that for its dtype (Backend::prefers_tiled_weights) and its columns make whole
// tiles (Backend::decoding_layout). Returns those it changed.
std::vector<ValueId> tile_weights(Graph& graph, const std::vector<ValueId>& weights, const Backend& backend);

}  // namespace paraflow::graph
