// A static dataflow graph of layer-level ops. Building a graph is separate from running it
// (graph/executor.h); passes (graph/autodiff.h, ...) turn one graph into another.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow::graph {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

enum class ValueRole : uint8_t {
  input,       // fed by the caller each run (tokens, targets)
  parameter,   // trained weights, bound by the caller
  state,       // persistent buffers bound by the caller (a KV cache)
  activation,  // produced by a forward node
  saved,       // produced by a forward node only for its backward (layernorm stats, attention log-sum-exps)
  gradient,    // produced by a backward node
};

struct Value {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  ValueRole role = ValueRole::activation;
  ValueId grad = kNoValue;  // the gradient value, once autodiff ran
};

// The op list, written once: the enum, the names, the op definitions (graph/ops/) and the
// passes' lists of known kinds are all expanded from it.
#define PARAFLOW_OP_KINDS(X) \
  X(embedding) X(layernorm) X(matmul) X(attention) X(attention_cached) X(attention_paged) X(add) X(softmax_xent) X(cast) \
  X(tp_copy) X(tp_reduce) X(rmsnorm) X(rope) X(swiglu)

#define PARAFLOW_OP_KIND_ENUMERATOR(kind) kind,
enum class OpKind : uint8_t { PARAFLOW_OP_KINDS(PARAFLOW_OP_KIND_ENUMERATOR) };
#undef PARAFLOW_OP_KIND_ENUMERATOR

const char* op_kind_name(OpKind kind);
// Every op kind, in the list's order.
const std::vector<OpKind>& all_op_kinds();

// Op attributes; each op documents the keys it reads.
class Attributes {
 public:
  Attributes& set(const std::string& key, int64_t value) { ints_[key] = value; return *this; }
  Attributes& set_float(const std::string& key, double value) { floats_[key] = value; return *this; }
  int64_t get(const std::string& key) const;
  int64_t get(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;

 private:
  std::map<std::string, int64_t> ints_;
  std::map<std::string, double> floats_;
};

struct Node {
  OpKind kind;
  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;  // the op's activations first, then values saved for backward
  Attributes attributes;
  // A backward node differentiates forward_node's op. It reads that node's tensors, or, when its
  // own inputs/outputs are set (gradient checkpointing), those values instead: recomputed copies.
  bool is_backward = false;
  bool is_recompute = false; // a forward op re-run during backward (gradient checkpointing)
  int32_t forward_node = -1;
};

class Graph {
 public:
  ValueId add_value(std::string name, Shape shape, DType dtype, ValueRole role);
  // Adds a forward node; the op infers and checks output shapes. Returns the output ids.
  std::vector<ValueId> add_node(OpKind kind, std::string name, std::vector<ValueId> inputs, Attributes attributes = {});
  int32_t add_backward_node(int32_t forward_node);
  // Re-runs forward node `original` during backward, writing `outputs` (clones of its outputs)
  // from `inputs`, scheduled just before node `before`; returns the new node's index.
  int32_t add_recompute_node(int32_t original, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                             int32_t before);
  // Moves `node` in the schedule to just before `before`.
  void move_before(int32_t node, int32_t before);
  // Makes forward node `node` read `to` wherever it read `from`.
  void replace_input(int32_t node, ValueId from, ValueId to);
  // Changes one integer attribute of a forward node (a layout pass).
  void set_attribute(int32_t node, const std::string& key, int64_t value);
  // Makes backward node `node` see `inputs`/`outputs` as its op's tensors.
  void set_backward_values(int32_t node, std::vector<ValueId> inputs, std::vector<ValueId> outputs);

  // The op a backward node differentiates, and the values it sees as that op's inputs/outputs.
  const Node& source_of(const Node& backward) const { return nodes_.at(static_cast<size_t>(backward.forward_node)); }
  const std::vector<ValueId>& backward_inputs(const Node& backward) const {
    return backward.inputs.empty() ? source_of(backward).inputs : backward.inputs;
  }
  const std::vector<ValueId>& backward_outputs(const Node& backward) const {
    return backward.outputs.empty() ? source_of(backward).outputs : backward.outputs;
  }
  // The execution order of all nodes (passes may insert nodes anywhere in it).
  const std::vector<int32_t>& schedule() const { return schedule_; }
  // True for nodes that run in Executor::backward(): backward and recompute nodes.
  static bool in_backward_phase(const Node& node) { return node.is_backward || node.is_recompute; }

  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  Value& value(ValueId id) { return values_.at(static_cast<size_t>(id)); }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  ValueId find(const std::string& name) const;  // kNoValue when absent

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<int32_t> schedule_;
  std::map<std::string, ValueId> by_name_;
};

}  // namespace paraflow::graph
