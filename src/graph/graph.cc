#include "graph/graph.h"

#include <algorithm>

#include "base/error.h"
#include "graph/op.h"

namespace paraflow::graph {

const char* op_kind_name(OpKind kind) {
#define PARAFLOW_OP_KIND_CASE(name) \
  case OpKind::name: return #name;
  switch (kind) { PARAFLOW_OP_KINDS(PARAFLOW_OP_KIND_CASE) }
#undef PARAFLOW_OP_KIND_CASE
  return "?";
}

const std::vector<OpKind>& all_op_kinds() {
#define PARAFLOW_OP_KIND_ELEMENT(name) OpKind::name,
  static const std::vector<OpKind> kinds{PARAFLOW_OP_KINDS(PARAFLOW_OP_KIND_ELEMENT)};
#undef PARAFLOW_OP_KIND_ELEMENT
  return kinds;
}

int64_t Attributes::get(const std::string& key) const {
  auto found = ints_.find(key);
  if (found == ints_.end()) throw Error("op attribute '" + key + "' is missing");
  return found->second;
}

int64_t Attributes::get(const std::string& key, int64_t fallback) const {
  auto found = ints_.find(key);
  return found == ints_.end() ? fallback : found->second;
}

double Attributes::get_float(const std::string& key) const {
  auto found = floats_.find(key);
  if (found == floats_.end()) throw Error("op attribute '" + key + "' is missing");
  return found->second;
}

ValueId Graph::add_value(std::string name, Shape shape, DType dtype, ValueRole role) {
  if (by_name_.count(name)) throw Error("graph already has a value named '" + name + "'");
  ValueId id = static_cast<ValueId>(values_.size());
  by_name_[name] = id;
  values_.push_back(Value{std::move(name), std::move(shape), dtype, role, kNoValue});
  return id;
}

std::vector<ValueId> Graph::add_node(OpKind kind, std::string name, std::vector<ValueId> inputs,
                                     Attributes attributes) {
  std::vector<const Value*> input_values;
  for (ValueId id : inputs) input_values.push_back(&value(id));
  std::vector<OutputSpec> specs = op_def(kind).infer(input_values, attributes);
  std::vector<ValueId> outputs;
  for (OutputSpec& spec : specs) outputs.push_back(add_value(name + spec.suffix, spec.shape, spec.dtype, spec.role));
  nodes_.push_back(Node{.kind = kind, .name = std::move(name), .inputs = std::move(inputs), .outputs = outputs,
                        .attributes = std::move(attributes)});
  schedule_.push_back(static_cast<int32_t>(nodes_.size() - 1));
  return outputs;
}

int32_t Graph::add_backward_node(int32_t forward_node) {
  const Node& forward = nodes_.at(static_cast<size_t>(forward_node));
  Node node{.kind = forward.kind, .name = forward.name + ".backward", .inputs = {}, .outputs = {},
            .attributes = forward.attributes,
            .is_backward = true, .forward_node = forward_node};
  nodes_.push_back(std::move(node));
  schedule_.push_back(static_cast<int32_t>(nodes_.size() - 1));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t Graph::add_recompute_node(int32_t original, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                                  int32_t before) {
  const Node& source = nodes_.at(static_cast<size_t>(original));
  Node node{.kind = source.kind, .name = source.name + ".recompute", .inputs = std::move(inputs),
            .outputs = std::move(outputs), .attributes = source.attributes, .is_recompute = true};
  nodes_.push_back(std::move(node));
  const auto index = static_cast<int32_t>(nodes_.size() - 1);
  auto position = std::find(schedule_.begin(), schedule_.end(), before);
  if (position == schedule_.end()) throw Error("add_recompute_node: node " + std::to_string(before) + " is not scheduled");
  schedule_.insert(position, index);
  return index;
}

void Graph::move_before(int32_t node, int32_t before) {
  schedule_.erase(std::find(schedule_.begin(), schedule_.end(), node));
  auto position = std::find(schedule_.begin(), schedule_.end(), before);
  if (position == schedule_.end()) throw Error("move_before: node " + std::to_string(before) + " is not scheduled");
  schedule_.insert(position, node);
}

void Graph::replace_input(int32_t node, ValueId from, ValueId to) {
  for (ValueId& input : nodes_.at(static_cast<size_t>(node)).inputs) {
    if (input == from) input = to;
  }
}

void Graph::set_attribute(int32_t node, const std::string& key, int64_t value) {
  nodes_.at(static_cast<size_t>(node)).attributes.set(key, value);
}

void Graph::set_backward_values(int32_t node, std::vector<ValueId> inputs, std::vector<ValueId> outputs) {
  Node& backward = nodes_.at(static_cast<size_t>(node));
  if (!backward.is_backward) throw Error("set_backward_values: '" + backward.name + "' is not a backward node");
  backward.inputs = std::move(inputs);
  backward.outputs = std::move(outputs);
}

ValueId Graph::find(const std::string& name) const {
  auto found = by_name_.find(name);
  return found == by_name_.end() ? kNoValue : found->second;
}

bool OpDef::runs_in(const Backend& backend, DType dtype, bool with_backward) const {
  for (KernelOp kernel : kernels()) {
    if (!with_backward && is_backward_kernel(kernel)) continue;
    if (!backend.supports(kernel, dtype)) return false;
  }
  return true;
}

void expect_shape(bool condition, const char* op, const std::string& what, const Shape& shape) {
  if (!condition) fail("{}: {} (got shape {})", op, what, shape.to_string());
}

}  // namespace paraflow::graph
