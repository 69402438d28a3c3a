// Gradient checkpointing as a graph pass. For each region (a set of forward nodes), the values
// it produces that only its own backward nodes read are dropped after forward: the memory planner
// frees them, and the producers the region's backward needs are re-run (recompute nodes) just
// before the region's first backward node, writing copies that the backward nodes read instead.
// Values read by backward nodes outside the region (the block's output) are kept. Recomputed
// values are bitwise the same, so gradients are unchanged.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace paraflow::graph {

// Run after add_backward_pass. Regions must not overlap.
void add_recompute(Graph& graph, const std::vector<std::vector<int32_t>>& regions);

// Regions whose outputs are all dropped, also those that backward nodes outside the region read
// (those nodes are rewired to the recomputed copies): for cheap producers such as the casts of
// the precision policy, whose f32 copies then live only around their readers.
void add_recompute_everywhere(Graph& graph, const std::vector<std::vector<int32_t>>& regions);

// Regions for a policy: "none"; "block" (forward nodes named "<prefix><i>." per index i, e.g.
// "h.0."); "attention" (each attention node alone; it keeps only its rows' log-sum-exps, so this
// drops little); or a comma-separated list of op kinds ("attention,layernorm": each node of those
// kinds alone). InputError for an unknown policy.
std::vector<std::vector<int32_t>> recompute_regions(const Graph& graph, const std::string& policy,
                                                    const std::string& block_prefix = "h.");

}  // namespace paraflow::graph
