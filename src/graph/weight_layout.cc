#include "graph/weight_layout.h"

#include "backend/kernel_args.h"

namespace paraflow::graph {

namespace {

// Gives `layout` to each weight read only by forward nodes that `may_change` (node, input index)
// accepts, applying `change` to the weight's value once; returns the weights changed.
template <typename MayChange, typename Change>
std::vector<ValueId> change_weight_layouts(Graph& graph, const std::vector<ValueId>& weights, WeightLayout layout,
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
        changeable = changeable && !node.is_backward && may_change(node, i);
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
  return change_weight_layouts(
      graph, weights, WeightLayout::out_in,
      [](const Node& node, size_t input) {
        return node.kind == OpKind::matmul && input == 1 && has_layout(node, WeightLayout::in_out);
      },
      [](Value& value) { value.shape = Shape{value.shape[1], value.shape[0]}; });
}

std::vector<ValueId> interleave_weights(Graph& graph, const std::vector<ValueId>& weights, const Backend& backend) {
  return change_weight_layouts(
      graph, weights, WeightLayout::out_in_interleaved,
      [&](const Node& node, size_t input) {
        if (input != 1 || !backend.prefers_interleaved_weights(graph.value(node.inputs[1]).dtype)) return false;
        // The embedding reads an interleaved table (wte, which the tied head multiplies by).
        return node.kind == OpKind::embedding || (node.kind == OpKind::matmul && has_layout(node, WeightLayout::out_in));
      },
      [](Value&) {});
}

std::vector<ValueId> tile_weights(Graph& graph, const std::vector<ValueId>& weights, const Backend& backend) {
  return change_weight_layouts(
      graph, weights, WeightLayout::out_in_tiles,
      [&](const Node& node, size_t input) {
        if (node.kind != OpKind::matmul || input != 1 || !has_layout(node, WeightLayout::out_in)) return false;
        const Value& weight = graph.value(node.inputs[1]);
        return backend.decoding_layout(weight.dtype, weight.shape[1]) == WeightLayout::out_in_tiles;
      },
      [](Value&) {});
}

}  // namespace paraflow::graph
