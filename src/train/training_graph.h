// The graph a training step runs: the GPT forward graph, the precision policy, autodiff, and
// gradient checkpointing — built the same way for the trainer and for `paraflow plan`; the whole
// model, or one pipeline stage's part of it, or one tensor-parallel shard of that.
#pragma once

#include <string>
#include <vector>

#include "dist/gradient_sync.h"
#include "graph/precision.h"
#include "model/gpt_graph.h"

namespace paraflow::train {

model::GptGraph build_training_graph(const model::GptConfig& config, int64_t micro_batch, int64_t sequence,
                                     const std::string& recompute, graph::PrecisionPolicy precision,
                                     const Backend& backend, const model::LayerRange& range = {},
                                     const model::TensorShard& shard = {});

// GradientSync's slices: the gradients of `graph`'s parameters, laid out as `specs` in one flat
// buffer (ParameterSet's layout).
std::vector<dist::GradientSlice> gradient_slices(const model::GptGraph& graph,
                                                 const std::vector<model::TensorSpec>& specs);

}  // namespace paraflow::train
