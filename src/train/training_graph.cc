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
  // The logits and the loss stay in f32.
  std::set<graph::ValueId> keep_f32;
  if (range.last) keep_f32 = {g.logits, g.losses};
  // Tensor-parallel shards' partial products are summed in f32 and rounded to 16 bits once, as
  // one process rounds the whole product.
  for (const graph::Node& node : g.graph.nodes()) {
    if (node.kind == graph::OpKind::tp_reduce) keep_f32.insert(node.inputs[0]);
  }
  std::set<graph::ValueId> stored_inputs;
  if (!range.first) stored_inputs.insert(g.stage_input);
  graph::PrecisionPlan plan =
      graph::apply_precision_policy(g.graph, precision, graph::GraphUse::training, keep_f32, backend, stored_inputs);
  model::name_half_parameters(g, plan);
  // What crosses between stages is f32: a stage stores its input like an activation and casts
  // its 16-bit residual stream back at its end.
  if (!range.last && g.graph.value(g.stage_output).dtype != DType::f32) {
    g.stage_output = g.graph.add_node(graph::OpKind::cast, "stage_output.cast", {g.stage_output},
                                      graph::Attributes().set("dtype", static_cast<int64_t>(DType::f32)))[0];
  }
  const graph::ValueId end = range.last ? g.losses : g.stage_output;
  std::vector<graph::ValueId> inputs_with_grads;
  if (!range.first) inputs_with_grads.push_back(g.stage_input);
  graph::add_backward_pass(g.graph, end, inputs_with_grads);
  std::vector<std::vector<int32_t>> regions = graph::recompute_regions(g.graph, recompute, config.block_prefix());
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

std::vector<dist::GradientSlice> gradient_slices(const model::GptGraph& graph,
                                                 const std::vector<model::TensorSpec>& specs) {
  std::vector<dist::GradientSlice> slices;
  int64_t offset = 0;
  for (const model::TensorSpec& spec : specs) {
    // A mixed-precision policy's 16-bit copy has its gradient bound to the same memory.
    std::vector<graph::ValueId> grads{graph.graph.value(graph.parameters.at(spec.name)).grad};
    if (graph.half_parameters.count(spec.name)) grads.push_back(graph.graph.value(graph.half_parameters.at(spec.name)).grad);
    slices.push_back({grads, offset, spec.shape.numel()});
    offset += spec.shape.numel();
  }
  return slices;
}

}  // namespace paraflow::train
