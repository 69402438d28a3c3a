#include "graph/autodiff.h"

#include <vector>

#include "base/error.h"
#include "graph/op.h"

namespace paraflow::graph {

void add_backward_pass(Graph& graph, ValueId loss, const std::vector<ValueId>& inputs_with_grads) {
  // Forward nodes in execution order (passes may have scheduled nodes out of index order).
  std::vector<int32_t> forward_order = graph.schedule();
  std::vector<bool> needs_grad(graph.values().size(), false);
  for (size_t id = 0; id < graph.values().size(); ++id) {
    needs_grad[id] = graph.value(static_cast<ValueId>(id)).role == ValueRole::parameter;
  }
  for (ValueId input : inputs_with_grads) needs_grad[static_cast<size_t>(input)] = true;
  // Forward sweep: an activation needs a gradient when a differentiable input has one.
  for (int32_t n : forward_order) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    if (node.is_backward) throw Error("add_backward_pass: the graph already has a backward pass");
    bool any = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      any = any || (op_def(node.kind).differentiable_input(i) && needs_grad[static_cast<size_t>(node.inputs[i])]);
    }
    for (ValueId out : node.outputs) {
      needs_grad.resize(graph.values().size(), false);
      if (graph.value(out).role == ValueRole::activation) needs_grad[static_cast<size_t>(out)] = any;
    }
  }
  if (!needs_grad[static_cast<size_t>(loss)]) throw Error("add_backward_pass: the loss does not depend on any parameter");

  const size_t value_count = graph.values().size();
  for (size_t id = 0; id < value_count; ++id) {
    if (!needs_grad[id]) continue;
    Value& value = graph.value(static_cast<ValueId>(id));
    std::string name = "grad:" + value.name;
    Shape shape = value.shape;
    // A parameter's gradient is f32 whatever its storage: it goes to the f32 master weights.
    DType dtype = value.role == ValueRole::parameter ? DType::f32 : value.dtype;
    ValueId grad = graph.add_value(name, shape, dtype, ValueRole::gradient);
    graph.value(static_cast<ValueId>(id)).grad = grad;
  }
  for (auto n = forward_order.rbegin(); n != forward_order.rend(); ++n) {
    const Node& node = graph.nodes()[static_cast<size_t>(*n)];
    bool output_has_grad = false;
    for (ValueId out : node.outputs) output_has_grad = output_has_grad || graph.value(out).grad != kNoValue;
    if (output_has_grad) graph.add_backward_node(*n);
  }
}

}  // namespace paraflow::graph
