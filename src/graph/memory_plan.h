// Memory planning: the lifetime of every value the executor owns (activations, values saved
// for backward, activation gradients) over the execution order — forward nodes, then backward
// and recompute nodes — and an offset for each in one arena, so values that are never alive at
// the same time share bytes. Values the caller binds or reads between runs stay outside.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace paraflow::graph {

struct MemoryPlan {
  std::vector<int64_t> offsets;  // per value: byte offset in the arena, or -1 when not planned
  int64_t arena_bytes = 0;       // the peak: the arena's size
  int64_t unplanned_sum_bytes = 0;  // what the planned values would take with one buffer each
};

// `outside[v]` marks values the planner must leave alone (bound, fed or read by the caller).
MemoryPlan plan_memory(const Graph& graph, const std::vector<bool>& outside);

// What stays outside the arena: values the caller binds or keeps (`caller_owned`), inputs, and
// the graph's outputs — activations that no node reads (the losses), which the caller reads
// after a run.
std::vector<bool> values_outside_plan(const Graph& graph, const std::vector<bool>& caller_owned);

// Node indices in execution order: the forward phase, then the backward phase (backward and
// recompute nodes), each in the graph's schedule order.
std::vector<size_t> execution_order(const Graph& graph);

}  // namespace paraflow::graph
