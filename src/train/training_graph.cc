#include "train/training_graph.h"

#include <set>

#include "graph/autodiff.h"
#include "graph/recompute.h"

namespace paraflow::train {

model::GptGraph build_training_graph(const model::GptConfig& config, int64_t micro_batch, int64_t sequence,
                                     const std::string& recompute, graph::PrecisionPolicy precision,
                                     const Backend& backend, const model::LayerRange& range,
                                     const model::TensorShard& shard) {
  model::GptGraph g = model::build_gpt_training_graph(config, micro_batch, sequence, range, shard);
  // The logits and the loss stay in f32, and so does what pipeline stages pass on.
  const graph::ValueId end = range.last ? g.losses : g.stage_output;
  std::set<graph::ValueId> keep_f32{end};
  if (range.last) keep_f32.insert(g.logits);
  graph::PrecisionPlan plan = graph::apply_precision_policy(g.graph, precision, keep_f32, backend);
  model::name_half_parameters(g, plan);
  std::vector<graph::ValueId> inputs_with_grads;
  if (!range.first) inputs_with_grads.push_back(g.stage_input);
  graph::add_backward_pass(g.graph, end, inputs_with_grads);
  std::vector<std::vector<int32_t>> regions = graph::recompute_regions(g.graph, recompute);
  graph::add_recompute(g.graph, regions);
  // The f32 copies of 16-bit values are re-cast before backward, unless a region already covers them.
  std::set<int32_t> covered;
  for (const auto& region : regions) covered.insert(region.begin(), region.end());
  std::vector<std::vector<int32_t>> casts;
  for (int32_t node : plan.cast_backs) {
    if (!covered.count(node)) casts.push_back({node});
  }
  graph::add_recompute_everywhere(g.graph, casts);
  return g;
}

}  // namespace paraflow::train
