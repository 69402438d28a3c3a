#include "graph/executor.h"

#include <chrono>

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
  gradient_writes_planned_ = false;
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

void Executor::plan_gradient_writes() {
  accumulate_.assign(graph_.nodes().size(), {});
  zero_before_backward_.assign(graph_.values().size(), false);
  std::vector<bool> written(graph_.values().size(), false);
  for (size_t n = 0; n < graph_.nodes().size(); ++n) {
    const Node& node = graph_.nodes()[n];
    if (!node.is_backward) continue;
    const Node& forward = graph_.nodes()[static_cast<size_t>(node.forward_node)];
    const OpDef& def = op_def(forward.kind);
    for (size_t i = 0; i < forward.inputs.size(); ++i) {
      ValueId grad = graph_.value(forward.inputs[i]).grad;
      bool accumulate = true;
      if (grad != kNoValue && !bound_[static_cast<size_t>(grad)] && !written[static_cast<size_t>(grad)]) {
        if (def.can_assign_input_grad(i)) {
          accumulate = false;
        } else {
          zero_before_backward_[static_cast<size_t>(grad)] = true;
        }
      }
      if (grad != kNoValue) written[static_cast<size_t>(grad)] = true;
      accumulate_[n].push_back(accumulate);
    }
  }
  gradient_writes_planned_ = true;
}

NodeTensors Executor::gather(size_t node_index) {
  const Node& node = graph_.nodes()[node_index];
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
    tensors.accumulate = accumulate_[node_index];
  }
  return tensors;
}

void Executor::run(size_t node_index) {
  const Node& node = graph_.nodes()[node_index];
  const OpDef& def = op_def(node.kind);
  NodeTensors tensors = gather(node_index);
  auto start = std::chrono::steady_clock::now();
  if (node.is_backward) {
    def.backward(backend_, tensors, node.attributes);
  } else {
    def.forward(backend_, tensors, node.attributes);
  }
  if (profiling_) {
    backend_.synchronize();
    std::string key = std::string(op_kind_name(node.kind)) + (node.is_backward ? " backward" : " forward");
    const Node& forward = node.is_backward ? graph_.nodes()[static_cast<size_t>(node.forward_node)] : node;
    if (forward.name == "lm_head") key = "lm_head" + key.substr(6);  // the vocabulary projection apart
    profile_[key] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

void Executor::forward() {
  for (size_t index = 0; index < graph_.nodes().size(); ++index) {
    if (!graph_.nodes()[index].is_backward) run(index);
  }
}

void Executor::backward() {
  if (!gradient_writes_planned_) plan_gradient_writes();
  for (size_t id = 0; id < graph_.values().size(); ++id) {
    if (zero_before_backward_[id]) backend_.fill_zero(tensor(static_cast<ValueId>(id)));
  }
  for (size_t index = 0; index < graph_.nodes().size(); ++index) {
    const Node& node = graph_.nodes()[index];
    if (!node.is_backward) continue;
    run(index);
    if (backward_hook_) backward_hook_(index);
  }
}

}  // namespace paraflow::graph
