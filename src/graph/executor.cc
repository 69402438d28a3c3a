#include "graph/executor.h"

#include "base/error.h"

namespace paraflow::graph {

Executor::Executor(const Graph& graph, Backend& backend)
    : graph_(graph), backend_(backend), tensors_(graph.values().size()), bound_(graph.values().size(), false) {}

void Executor::bind(ValueId id, const Tensor& tensor) {
  const Value& value = graph_.value(id);
  if (!(tensor.shape() == value.shape) || tensor.dtype() != value.dtype) {
    throw Error(fmt::format("binding '{}': expected {} {}, got {} {}", value.name, dtype_name(value.dtype),
                            value.shape.to_string(), dtype_name(tensor.dtype()), tensor.shape().to_string()));
  }
  tensors_[static_cast<size_t>(id)] = tensor;
  bound_[static_cast<size_t>(id)] = true;
}

const Tensor& Executor::tensor(ValueId id) {
  Tensor& slot = tensors_.at(static_cast<size_t>(id));
  if (!slot.defined()) {
    const Value& value = graph_.value(id);
    if (value.role == ValueRole::parameter || value.role == ValueRole::state) {
      throw Error(fmt::format("graph value '{}' was not bound before running", value.name));
    }
    slot = backend_.empty(value.shape, value.dtype);
  }
  return slot;
}

NodeTensors Executor::gather(const Node& node) {
  const Node& forward = node.is_backward ? graph_.nodes()[static_cast<size_t>(node.forward_node)] : node;
  NodeTensors tensors;
  for (ValueId id : forward.inputs) tensors.inputs.push_back(tensor(id));
  for (ValueId id : forward.outputs) tensors.outputs.push_back(tensor(id));
  if (node.is_backward) {
    for (ValueId id : forward.inputs) {
      ValueId grad = graph_.value(id).grad;
      tensors.input_grads.push_back(grad == kNoValue ? Tensor() : tensor(grad));
    }
    for (ValueId id : forward.outputs) {
      ValueId grad = graph_.value(id).grad;
      tensors.output_grads.push_back(grad == kNoValue ? Tensor() : tensor(grad));
    }
  }
  return tensors;
}

void Executor::run(const Node& node) {
  const OpDef& def = op_def(node.kind);
  NodeTensors tensors = gather(node);
  if (node.is_backward) {
    def.backward(backend_, tensors, node.attributes);
  } else {
    def.forward(backend_, tensors, node.attributes);
  }
}

void Executor::forward() {
  for (const Node& node : graph_.nodes()) {
    if (!node.is_backward) run(node);
  }
}

void Executor::backward() {
  for (size_t id = 0; id < graph_.values().size(); ++id) {
    const Value& value = graph_.value(static_cast<ValueId>(id));
    if (value.role == ValueRole::gradient && !bound_[id]) backend_.fill_zero(tensor(static_cast<ValueId>(id)));
  }
  for (const Node& node : graph_.nodes()) {
    if (node.is_backward) run(node);
  }
}

}  // namespace paraflow::graph
