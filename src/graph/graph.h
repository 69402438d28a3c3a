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
  saved,       // produced by a forward node only for its backward (layernorm stats, softmax probs)
  gradient,    // produced by a backward node
};

struct Value {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  ValueRole role = ValueRole::activation;
  ValueId grad = kNoValue;  // the gradient value, once autodiff ran
};

enum class OpKind : uint8_t { embedding, layernorm, matmul, attention, attention_cached, add, softmax_xent };
const char* op_kind_name(OpKind kind);

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
  bool is_backward = false;  // a backward node reads forward_node's tensors and the output grads
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
  // from `inputs`; returns the new node's index.
  int32_t add_recompute_node(int32_t original, std::vector<ValueId> inputs, std::vector<ValueId> outputs);
  // Makes backward node `node` read the tensors of forward (or recompute) node `source`.
  void set_backward_source(int32_t node, int32_t source) { nodes_.at(static_cast<size_t>(node)).forward_node = source; }
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
  std::map<std::string, ValueId> by_name_;
};

}  // namespace paraflow::graph
