#include "graph/executor.h"

#include <chrono>

#include "base/error.h"

namespace paraflow::graph {

Executor::Executor(const Graph& graph, Backend& backend)
    : graph_(graph),
      backend_(backend),
      tensors_(graph.values().size()),
      bound_(graph.values().size(), false),
      kept_(graph.values().size(), false),
      host_memory_(graph.values().size(), false) {
  for (const Node& node : graph.nodes()) {
    const OpDef& def = op_def(node.kind);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (def.host_memory_input(i)) host_memory_[static_cast<size_t>(node.inputs[i])] = true;
    }
  }
}

void Executor::bind(ValueId id, const Tensor& tensor) {
  const Value& value = graph_.value(id);
  if (host_memory_[static_cast<size_t>(id)] && !tensor.host_accessible()) {
    throw Error(fmt::format("binding '{}': an op reads it on the host, but the tensor is in {} memory", value.name,
                            tensor.device().to_string()));
  }
  if (!(tensor.shape() == value.shape) || tensor.dtype() != value.dtype) {
    throw Error(fmt::format("binding '{}': expected {} {}, got {} {}", value.name, dtype_name(value.dtype),
                            value.shape.to_string(), dtype_name(tensor.dtype()), tensor.shape().to_string()));
  }
  if (planned_) throw Error(fmt::format("binding '{}' after the executor planned its memory", value.name));
  tensors_[static_cast<size_t>(id)] = tensor;
  bound_[static_cast<size_t>(id)] = true;
}

void Executor::keep(ValueId id) {
  if (planned_) throw Error("Executor::keep after the executor planned its memory");
  kept_[static_cast<size_t>(id)] = true;
}

const MemoryPlan& Executor::memory_plan() {
  if (!planned_) plan();
  return memory_plan_;
}

void Executor::plan() {
  std::vector<bool> caller_owned(graph_.values().size(), false);
  for (size_t v = 0; v < caller_owned.size(); ++v) caller_owned[v] = bound_[v] || kept_[v];
  std::vector<bool> outside = values_outside_plan(graph_, caller_owned);
  memory_plan_ = plan_memory(graph_, outside);
  arena_ = backend_.empty(Shape{std::max<int64_t>(memory_plan_.arena_bytes / 4, 1)}, DType::f32);
  for (size_t v = 0; v < outside.size(); ++v) {
    if (memory_plan_.offsets[v] < 0) continue;
    const Value& value = graph_.values()[v];
    tensors_[v] = arena_.view(static_cast<size_t>(memory_plan_.offsets[v]), value.shape, value.dtype);
  }
  plan_gradient_writes();
  planned_ = true;
  // Every node's tensors, gathered once: running a node then allocates nothing (decoding a
  // token runs the same nodes over the same memory every time).
  gathered_.clear();
  for (size_t n = 0; n < graph_.nodes().size(); ++n) gathered_.push_back(gather(n));
}

const Tensor& Executor::tensor(ValueId id) {
  Tensor& slot = tensors_.at(static_cast<size_t>(id));
  if (!slot.defined()) {
    const Value& value = graph_.value(id);
    if (value.role == ValueRole::parameter || value.role == ValueRole::state) {
      throw Error(fmt::format("graph value '{}' was not bound before running", value.name));
    }
    slot = host_memory_[static_cast<size_t>(id)] ? Tensor::zeros(value.shape, value.dtype)
                                                 : backend_.empty(value.shape, value.dtype);
  }
  return slot;
}

void Executor::plan_gradient_writes() {
  accumulate_.assign(graph_.nodes().size(), {});
  zero_first_.assign(graph_.nodes().size(), {});
  std::vector<bool> written(graph_.values().size(), false);
  for (size_t n : execution_order(graph_)) {
    const Node& node = graph_.nodes()[n];
    if (!node.is_backward) continue;
    const OpDef& def = op_def(node.kind);
    const std::vector<ValueId>& inputs = graph_.backward_inputs(node);
    for (size_t i = 0; i < inputs.size(); ++i) {
      ValueId grad = graph_.value(inputs[i]).grad;
      bool accumulate = true;
      if (grad != kNoValue && !bound_[static_cast<size_t>(grad)] && !written[static_cast<size_t>(grad)]) {
        if (def.can_assign_input_grad(i)) {
          accumulate = false;
        } else {
          zero_first_[n].push_back(grad);  // zeroed just in time: its arena bytes may be in use until then
        }
      }
      if (grad != kNoValue) written[static_cast<size_t>(grad)] = true;
      accumulate_[n].push_back(accumulate);
    }
  }
}

NodeTensors Executor::gather(size_t node_index) {
  const Node& node = graph_.nodes()[node_index];
  NodeTensors tensors;
  tensors.group = group_;
  if (!node.is_backward) {
    for (ValueId id : node.inputs) tensors.inputs.push_back(tensor(id));
    for (ValueId id : node.outputs) tensors.outputs.push_back(tensor(id));
    return tensors;
  }
  for (ValueId id : graph_.backward_inputs(node)) {
    tensors.inputs.push_back(tensor(id));
    ValueId grad = graph_.value(id).grad;
    tensors.input_grads.push_back(grad == kNoValue ? Tensor() : tensor(grad));
  }
  for (ValueId id : graph_.backward_outputs(node)) {
    tensors.outputs.push_back(tensor(id));
    ValueId grad = graph_.value(id).grad;
    tensors.output_grads.push_back(grad == kNoValue ? Tensor() : tensor(grad));
  }
  tensors.accumulate = accumulate_[node_index];
  return tensors;
}

void Executor::run(size_t node_index) {
  const Node& node = graph_.nodes()[node_index];
  const OpDef& def = op_def(node.kind);
  for (ValueId grad : zero_first_[node_index]) backend_.fill_zero(tensor(grad));
  const NodeTensors& tensors = row_views_.empty() ? gathered_[node_index] : row_views_[node_index];
  auto start = std::chrono::steady_clock::now();
  // A kernel's complaint names the node it came from.
  auto where = [&] { return fmt::format("node '{}' ({}{})", node.name, op_kind_name(node.kind), node.is_backward ? " backward" : ""); };
  try {
    if (node.is_backward) {
      def.backward(backend_, tensors, node.attributes);
    } else {
      def.forward(backend_, tensors, node.attributes);
    }
  } catch (const InputError& error) {
    throw InputError(fmt::format("{}: {}", where(), error.what()));
  } catch (const Error& error) {
    throw Error(fmt::format("{}: {}", where(), error.what()));
  }
  if (profiling_) {
    backend_.synchronize();
    std::string key = std::string(op_kind_name(node.kind)) + (node.is_backward ? " backward" : " forward");
    const Node& forward = node.is_backward ? graph_.source_of(node) : node;
    // A node marked profile_apart (the model's vocabulary projection, say) keeps its own line.
    if (forward.attributes.get("profile_apart", 0) != 0) key = forward.name + key.substr(key.find(' '));
    profile_[key] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

void Executor::set_rows(int64_t capacity, int64_t rows) {
  check(rows >= 1 && rows <= capacity, "Executor::set_rows: {} rows of a capacity of {}", rows, capacity);
  if (!planned_) plan();
  if (rows == rows_) return;  // decoding runs the same batch size step after step
  rows_ = rows;
  row_views_.clear();
  if (rows == capacity) return;
  auto cut = [&](const std::vector<ValueId>& ids, std::vector<Tensor>& tensors) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const Value& value = graph_.value(ids[i]);
      if (value.role == ValueRole::parameter || value.role == ValueRole::state) continue;
      if (value.shape.rank() == 0 || value.shape[0] != capacity) continue;
      std::vector<int64_t> dims = value.shape.dims();
      dims[0] = rows;
      tensors[i] = tensors[i].view(0, Shape(dims), value.dtype);
    }
  };
  row_views_ = gathered_;
  for (size_t n = 0; n < graph_.nodes().size(); ++n) {
    const Node& node = graph_.nodes()[n];
    if (node.is_backward) continue;
    cut(node.inputs, row_views_[n].inputs);
    cut(node.outputs, row_views_[n].outputs);
  }
}

void Executor::run_hooked(size_t node_index) {
  if (before_node_) before_node_(node_index);
  run(node_index);
  if (after_node_) after_node_(node_index);
}

void Executor::forward() {
  if (!planned_) plan();
  for (int32_t index : graph_.schedule()) {
    if (!Graph::in_backward_phase(graph_.nodes()[static_cast<size_t>(index)])) run_hooked(static_cast<size_t>(index));
  }
}

void Executor::backward() {
  if (!planned_) plan();
  for (int32_t scheduled : graph_.schedule()) {
    const auto index = static_cast<size_t>(scheduled);
    const Node& node = graph_.nodes()[index];
    if (!Graph::in_backward_phase(node)) continue;
    run_hooked(index);
    if (node.is_backward && backward_hook_) backward_hook_(index);
  }
}

}  // namespace paraflow::graph
