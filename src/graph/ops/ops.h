// The built-in op definitions; graph/ops/registry.cc maps OpKind to them.
#pragma once

#include "base/error.h"
#include "graph/op.h"

namespace paraflow::graph {

const OpDef& embedding_op();
const OpDef& layernorm_op();
const OpDef& matmul_op();
const OpDef& attention_op();
const OpDef& attention_cached_op();
const OpDef& add_op();
const OpDef& softmax_xent_op();
const OpDef& cast_op();

// Rows of a (..., C) tensor: the product of all but the last dimension.
inline int64_t leading_rows(const Shape& shape) { return shape.numel() / shape[shape.rank() - 1]; }

}  // namespace paraflow::graph
