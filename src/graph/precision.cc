#include "graph/precision.h"

#include <algorithm>

#include "base/error.h"

namespace paraflow::graph {

PrecisionPolicy parse_precision_policy(const std::string& name) {
  if (name == "float32") return PrecisionPolicy::float32;
  if (name == "mixed_bfloat16") return PrecisionPolicy::mixed_bfloat16;
  if (name == "mixed_float16") return PrecisionPolicy::mixed_float16;
  fail("train.precision: '{}' is not float32, mixed_bfloat16 or mixed_float16", name);
}

const char* precision_policy_name(PrecisionPolicy policy) {
  switch (policy) {
    case PrecisionPolicy::float32: return "float32";
    case PrecisionPolicy::mixed_bfloat16: return "mixed_bfloat16";
    case PrecisionPolicy::mixed_float16: return "mixed_float16";
  }
  return "?";
}

DType storage_dtype(PrecisionPolicy policy) {
  switch (policy) {
    case PrecisionPolicy::float32: return DType::f32;
    case PrecisionPolicy::mixed_bfloat16: return DType::bf16;
    case PrecisionPolicy::mixed_float16: return DType::f16;
  }
  return DType::f32;
}

std::vector<int32_t> apply_precision_policy(Graph& graph, PrecisionPolicy policy, const std::set<ValueId>& keep_f32) {
  std::vector<int32_t> cast_backs;
  if (policy == PrecisionPolicy::float32) return cast_backs;
  const DType half = storage_dtype(policy);
  // Candidates: parameters, and the first output (the activation) of every forward op.
  std::vector<ValueId> candidates;
  for (size_t v = 0; v < graph.values().size(); ++v) {
    if (graph.values()[v].role == ValueRole::parameter) candidates.push_back(static_cast<ValueId>(v));
  }
  const size_t forward_nodes = graph.nodes().size();
  for (size_t n = 0; n < forward_nodes; ++n) {
    const Node& node = graph.nodes()[n];
    if (!node.is_backward && !node.is_recompute) candidates.push_back(node.outputs.front());
  }
  for (ValueId v : candidates) {
    const Value value = graph.value(v);
    if (keep_f32.count(v) || value.dtype != DType::f32) continue;
    std::vector<int32_t> readers;
    for (int32_t n : graph.schedule()) {
      const Node& node = graph.nodes()[static_cast<size_t>(n)];
      if (std::find(node.inputs.begin(), node.inputs.end(), v) != node.inputs.end()) readers.push_back(n);
    }
    if (readers.empty()) continue;
    // Cast nodes carry the value's name, so a block's casts belong to the block's region.
    ValueId stored = graph.add_node(OpKind::cast, value.name + ".stored", {v},
                                    Attributes().set("dtype", static_cast<int64_t>(half)))[0];
    const auto to_half = static_cast<int32_t>(graph.nodes().size() - 1);
    ValueId copy = graph.add_node(OpKind::cast, value.name + ".f32", {stored},
                                  Attributes().set("dtype", static_cast<int64_t>(DType::f32)))[0];
    const auto to_f32 = static_cast<int32_t>(graph.nodes().size() - 1);
    graph.move_before(to_half, readers.front());
    graph.move_before(to_f32, readers.front());
    for (int32_t reader : readers) graph.replace_input(reader, v, copy);
    cast_backs.push_back(to_f32);
  }
  return cast_backs;
}

}  // namespace paraflow::graph
