#include "graph/precision.h"

#include <algorithm>
#include <map>

#include "base/error.h"
#include "graph/op.h"
#include "tensor/quantized.h"

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

namespace {

struct Reader {
  int32_t node;
  bool accepts_half;  // at every position it reads the value from
};

std::vector<Reader> readers_of(const Graph& graph, ValueId value, DType half, GraphUse use, const Backend& backend) {
  std::vector<Reader> readers;
  for (int32_t n : graph.schedule()) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    bool reads = false, accepts = true;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (node.inputs[i] != value) continue;
      reads = true;
      const OpDef& def = op_def(node.kind);
      accepts = accepts && def.accepts_half_input(i) && def.runs_in(backend, half, use == GraphUse::training);
    }
    if (reads) readers.push_back({n, accepts});
  }
  return readers;
}

// Adds `name` = cast(`value`) to `dtype`, scheduled before node `before`; returns (value, node).
std::pair<ValueId, int32_t> add_cast(Graph& graph, ValueId value, const std::string& name, DType dtype, int32_t before) {
  ValueId out = graph.add_node(OpKind::cast, name, {value}, Attributes().set("dtype", static_cast<int64_t>(dtype)))[0];
  const auto node = static_cast<int32_t>(graph.nodes().size() - 1);
  graph.move_before(node, before);
  return {out, node};
}

}  // namespace

PrecisionPlan apply_precision_policy(Graph& graph, PrecisionPolicy policy, GraphUse use, const std::set<ValueId>& keep_f32,
                                     const Backend& backend, const std::set<ValueId>& stored_inputs) {
  PrecisionPlan plan;
  if (policy == PrecisionPolicy::float32) return plan;
  const DType half = storage_dtype(policy);
  // Stores activation `value` in 16 bits (unless it already is): readers that take 16-bit inputs
  // read that, the others an f32 copy cast back from it. Cast nodes carry the value's name, so a
  // transformer block's casts fall inside the block's recompute region.
  auto store_half = [&](ValueId value) {
    std::vector<Reader> readers = readers_of(graph, value, half, use, backend);
    if (readers.empty()) return;
    const std::string name = graph.value(value).name;
    ValueId stored = value;
    if (graph.value(value).dtype == DType::f32) {
      stored = add_cast(graph, value, name + ".stored", half, readers.front().node).first;
      for (const Reader& reader : readers) {
        if (reader.accepts_half) graph.replace_input(reader.node, value, stored);
      }
    }
    int32_t first_f32_reader = -1;
    for (const Reader& reader : readers) {
      if (!reader.accepts_half) {
        first_f32_reader = reader.node;
        break;
      }
    }
    if (first_f32_reader < 0) return;
    auto [copy, node] = add_cast(graph, stored, name + ".f32", DType::f32, first_f32_reader);
    for (const Reader& reader : readers) {
      if (!reader.accepts_half) graph.replace_input(reader.node, value, copy);
    }
    plan.cast_backs.push_back(node);
  };

  // Parameters: readers that take 16-bit inputs read a 16-bit copy bound by the caller (no cast
  // per step); the others keep reading the f32 parameter.
  const size_t value_count = graph.values().size();
  for (size_t v = 0; v < value_count; ++v) {
    const auto parameter = static_cast<ValueId>(v);
    if (graph.value(parameter).role != ValueRole::parameter) continue;
    std::vector<Reader> readers = readers_of(graph, parameter, half, use, backend);
    ValueId copy = kNoValue;
    for (const Reader& reader : readers) {
      if (!reader.accepts_half) continue;
      if (copy == kNoValue) {
        const Value& value = graph.value(parameter);
        copy = graph.add_value(value.name + "." + dtype_name(half), value.shape, half, ValueRole::parameter);
        plan.half_parameters.emplace_back(parameter, copy);
      }
      graph.replace_input(reader.node, parameter, copy);
    }
  }
  for (ValueId input : stored_inputs) store_half(input);
  std::vector<int32_t> forward_nodes;
  for (int32_t n : graph.schedule()) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    if (node.kind != OpKind::cast && !node.is_backward && !node.is_recompute) forward_nodes.push_back(n);
  }
  for (int32_t n : forward_nodes) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    const ValueId out = node.outputs.front();
    // An op reading 16-bit inputs writes its activation in 16 bits too, unless it must stay f32
    // (the logits: only ops that can write f32 from 16-bit inputs, like matmul, may produce those).
    const OpDef& def = op_def(node.kind);
    bool reads_half = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      reads_half = reads_half ||
                   (def.accepts_half_input(i) && def.runs_in(backend, half, use == GraphUse::training) &&
                    graph.value(node.inputs[i]).dtype == half);
    }
    if (reads_half && !keep_f32.count(out)) {
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        if (def.output_follows_half_inputs(o)) graph.value(node.outputs[o]).dtype = half;
      }
    }
    if (!keep_f32.count(out)) store_half(out);
  }
  return plan;
}

PrecisionPlan read_matmul_weights_in(Graph& graph, DType dtype) {
  PrecisionPlan plan;
  std::map<ValueId, ValueId> copies;
  for (int32_t n : graph.schedule()) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    if (node.kind != OpKind::matmul || node.is_backward) continue;
    const ValueId weight = node.inputs[1];
    if (graph.value(weight).role != ValueRole::parameter) continue;
    auto [found, added] = copies.emplace(weight, kNoValue);
    if (added) {
      const Value value = graph.value(weight);
      const Shape& rows = graph.value(node.inputs[0]).shape;  // the weight's stored rows are as long as these
      const DType type = quantized_type_for_rows(dtype, rows[rows.rank() - 1]);
      found->second = graph.add_value(value.name + "." + dtype_name(type), value.shape, type, ValueRole::parameter);
      plan.half_parameters.emplace_back(weight, found->second);
    }
    graph.replace_input(n, weight, found->second);
  }
  return plan;
}

}  // namespace paraflow::graph
