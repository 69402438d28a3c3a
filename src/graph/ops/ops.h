// The built-in op definitions; graph/ops/registry.cc maps OpKind to them.
#pragma once

#include "base/error.h"
#include "graph/op.h"

namespace paraflow::graph {

// embedding_op(), layernorm_op(), ...: one per entry of PARAFLOW_OP_KINDS, in graph/ops/<kind>.cc
// (tp_copy and tp_reduce together in graph/ops/tensor_parallel.cc).
#define PARAFLOW_OP_DEF_DECLARATION(name) const OpDef& name##_op();
PARAFLOW_OP_KINDS(PARAFLOW_OP_DEF_DECLARATION)
#undef PARAFLOW_OP_DEF_DECLARATION

// The head size of a fused qkv's last dimension (n_head + 2·n_kv_head)·head_size, checking it
// (and that n_kv_head divides n_head) for `op`.
int64_t qkv_head_size(const Shape& qkv, int64_t n_head, int64_t n_kv_head, const char* op);

// rope's attributes as the kernels' RopeFrequencies (graph/ops/rope.cc lists the keys).
RopeFrequencies rope_frequencies(const Attributes& attributes);

// Rows of a (..., C) tensor: the product of all but the last dimension.
inline int64_t leading_rows(const Shape& shape) { return shape.numel() / shape[shape.rank() - 1]; }

}  // namespace paraflow::graph
