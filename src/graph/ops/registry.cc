#include "graph/ops/ops.h"

namespace paraflow::graph {

const OpDef& op_def(OpKind kind) {
#define PARAFLOW_OP_DEF_CASE(name) \
  case OpKind::name: return name##_op();
  switch (kind) { PARAFLOW_OP_KINDS(PARAFLOW_OP_DEF_CASE) }
#undef PARAFLOW_OP_DEF_CASE
  throw Error("unknown op kind");
}

}  // namespace paraflow::graph
