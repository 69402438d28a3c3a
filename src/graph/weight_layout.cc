#include "graph/weight_layout.h"

#include "backend/kernel_args.h"

namespace paraflow::graph {

namespace {

// Gives `layout` to each weight read only as the weight input of forward matmuls that
// `may_change` (node) accepts, applying `change` to the weight's value once; returns the weights
// changed.
template <typename MayChange, typename Change>
std::vector<ValueId> change_matmul_layouts(Graph& graph, const std::vector<ValueId>& weights, WeightLayout layout,
                                           MayChange may_change, Change change) {
  std::vector<ValueId> changed;
  for (ValueId weight : weights) {
    std::vector<int32_t> readers;
    bool changeable = true;
    for (int32_t n : graph.schedule()) {
      const Node& node = graph.nodes()[static_cast<size_t>(n)];
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        if (node.inputs[i] != weight) continue;
        readers.push_back(n);
        changeable = changeable && !node.is_backward && node.kind == OpKind::matmul && i == 1 && may_change(node);
      }
    }
    if (readers.empty() || !changeable) continue;
    change(graph.value(weight));
    for (int32_t n : readers) graph.set_attribute(n, "layout", static_cast<int64_t>(layout));
    changed.push_back(weight);
  }
  return changed;
}

bool has_layout(const Node& node, WeightLayout layout) {
  return node.attributes.get("layout", 0) == static_cast<int64_t>(layout);
}

}  // namespace

std::vector<ValueId> transpose_matmul_weights(Graph& graph, const std::vector<ValueId>& weights) {
  return change_matmul_layouts(
      graph, weights, WeightLayout::out_in, [](const Node& node) { return has_layout(node, WeightLayout::in_out); },
      [](Value& value) { value.shape = Shape{value.shape[1], value.shape[0]}; });
}

std::vector<ValueId> interleave_matmul_weights(Graph& graph, const std::vector<ValueId>& weights,
                                               const Backend& backend) {
  return change_matmul_layouts(
      graph, weights, WeightLayout::out_in_interleaved,
      [&](const Node& node) {
        const Value& weight = graph.value(node.inputs[1]);
        return has_layout(node, WeightLayout::out_in) && backend.prefers_interleaved_weights(weight.dtype);
      },
      [](Value&) {});
}

}  // namespace paraflow::graph
