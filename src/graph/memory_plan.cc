#include "graph/memory_plan.h"

#include <algorithm>
#include <limits>

#include "graph/op.h"

namespace paraflow::graph {

namespace {

constexpr int64_t kAlignment = 64;

int64_t aligned_bytes(const Value& value) {
  int64_t bytes = static_cast<int64_t>(dtype_bytes(value.dtype, value.shape.numel()));
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace

std::vector<size_t> execution_order(const Graph& graph) {
  std::vector<size_t> order;
  for (int32_t n : graph.schedule()) {
    if (!Graph::in_backward_phase(graph.nodes()[static_cast<size_t>(n)])) order.push_back(static_cast<size_t>(n));
  }
  for (int32_t n : graph.schedule()) {
    if (Graph::in_backward_phase(graph.nodes()[static_cast<size_t>(n)])) order.push_back(static_cast<size_t>(n));
  }
  return order;
}

MemoryPlan plan_memory(const Graph& graph, const std::vector<bool>& outside) {
  const size_t count = graph.values().size();
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> first(count, kNever), last(count, -1);
  auto touch = [&](ValueId id, int64_t position) {
    if (id == kNoValue) return;
    size_t v = static_cast<size_t>(id);
    first[v] = std::min(first[v], position);
    last[v] = std::max(last[v], position);
  };
  std::vector<size_t> order = execution_order(graph);
  for (size_t position = 0; position < order.size(); ++position) {
    const Node& node = graph.nodes()[order[position]];
    const auto p = static_cast<int64_t>(position);
    if (!node.is_backward) {
      for (ValueId id : node.inputs) touch(id, p);
      for (ValueId id : node.outputs) touch(id, p);
      continue;
    }
    const OpDef& def = op_def(node.kind);
    const std::vector<ValueId>& inputs = graph.backward_inputs(node);
    const std::vector<ValueId>& outputs = graph.backward_outputs(node);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (def.backward_reads_input(i)) touch(inputs[i], p);
      touch(graph.value(inputs[i]).grad, p);
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (def.backward_reads_output(i)) touch(outputs[i], p);
      touch(graph.value(outputs[i]).grad, p);
    }
  }

  MemoryPlan plan;
  plan.offsets.assign(count, -1);
  std::vector<size_t> planned;
  for (size_t v = 0; v < count; ++v) {
    if (!outside[v] && first[v] != kNever) {
      planned.push_back(v);
      plan.unplanned_sum_bytes += aligned_bytes(graph.values()[v]);
    }
  }
  // Greedy by size: the largest values first, each at the lowest offset that does not overlap
  // a placed value whose lifetime intersects its own.
  std::stable_sort(planned.begin(), planned.end(), [&](size_t a, size_t b) {
    return aligned_bytes(graph.values()[a]) > aligned_bytes(graph.values()[b]);
  });
  std::vector<size_t> placed;
  for (size_t v : planned) {
    const int64_t size = aligned_bytes(graph.values()[v]);
    std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of conflicting placements
    for (size_t other : placed) {
      if (first[other] <= last[v] && first[v] <= last[other]) {
        busy.emplace_back(plan.offsets[other], plan.offsets[other] + aligned_bytes(graph.values()[other]));
      }
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    plan.offsets[v] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(v);
  }
  return plan;
}

std::vector<bool> values_outside_plan(const Graph& graph, const std::vector<bool>& caller_owned) {
  std::vector<bool> read(graph.values().size(), false);
  for (const Node& node : graph.nodes()) {
    for (ValueId id : node.inputs) read[static_cast<size_t>(id)] = true;
    if (node.is_backward) {
      const OpDef& def = op_def(node.kind);
      const std::vector<ValueId>& outputs = graph.backward_outputs(node);
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (def.backward_reads_output(i)) read[static_cast<size_t>(outputs[i])] = true;
      }
    }
  }
  std::vector<bool> outside(graph.values().size(), false);
  for (size_t v = 0; v < outside.size(); ++v) {
    const Value& value = graph.values()[v];
    // A saved value nobody reads (its backward reads a recomputed copy) is scratch, not an output.
    bool output = !read[v] && value.role == ValueRole::activation;
    outside[v] = caller_owned[v] || value.role == ValueRole::input || output;
  }
  return outside;
}

}  // namespace paraflow::graph
