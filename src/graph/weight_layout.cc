#include "graph/weight_layout.h"

#include "backend/kernel_args.h"

namespace paraflow::graph {

std::vector<ValueId> transpose_matmul_weights(Graph& graph, const std::vector<ValueId>& weights) {
  std::vector<ValueId> changed;
  for (ValueId weight : weights) {
    std::vector<int32_t> readers;
    bool transposable = true;
    for (int32_t n : graph.schedule()) {
      const Node& node = graph.nodes()[static_cast<size_t>(n)];
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        if (node.inputs[i] != weight) continue;
        readers.push_back(n);
        transposable = transposable && !node.is_backward && node.kind == OpKind::matmul && i == 1 &&
                       node.attributes.get("layout", 0) == static_cast<int64_t>(WeightLayout::in_out);
      }
    }
    if (readers.empty() || !transposable) continue;
    Value& value = graph.value(weight);
    value.shape = Shape{value.shape[1], value.shape[0]};
    for (int32_t n : readers) graph.set_attribute(n, "layout", static_cast<int64_t>(WeightLayout::out_in));
    changed.push_back(weight);
  }
  return changed;
}

}  // namespace paraflow::graph
