#include "graph/ops/ops.h"

namespace paraflow::graph {

const OpDef& op_def(OpKind kind) {
  switch (kind) {
    case OpKind::embedding: return embedding_op();
    case OpKind::layernorm: return layernorm_op();
    case OpKind::matmul: return matmul_op();
    case OpKind::attention: return attention_op();
    case OpKind::attention_cached: return attention_cached_op();
    case OpKind::add: return add_op();
    case OpKind::softmax_xent: return softmax_xent_op();
    case OpKind::cast: return cast_op();
  }
  throw Error("unknown op kind");
}

}  // namespace paraflow::graph
