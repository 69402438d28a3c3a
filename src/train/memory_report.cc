#include "train/memory_report.h"

#include <fmt/format.h>

#include "graph/memory_plan.h"
#include "train/training_graph.h"

namespace paraflow::train {

namespace {

std::string mib(int64_t bytes) { return fmt::format("{:9.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

std::string MemoryReport::to_text() const {
  std::string text;
  text += fmt::format("parameters       {}\n", mib(parameters));
  text += fmt::format("gradients        {}\n", mib(gradients));
  text += fmt::format("optimizer state  {}  (AdamW moments{})\n", mib(optimizer_state), zero_shards > 1 ? fmt::format(", ZeRO-1: 1/{} each", zero_shards) : "");
  text += fmt::format("activations      {}  (planned arena; {} with a buffer per value)\n", mib(activations),
                      mib(activations_unplanned));
  text += fmt::format("inputs, losses   {}\n", mib(inputs));
  text += fmt::format("workspace        {}\n", mib(workspace));
  text += fmt::format("total            {}\n", mib(total()));
  return text;
}

MemoryReport estimate_training_memory(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      int threads) {
  const int64_t micro_batch = config.batch_size / (ranks * config.grad_accumulation);
  const int64_t T = config.sequence_length, C = model.n_embd;
  model::GptGraph g = build_training_graph(model, micro_batch, T, config.recompute, config.precision,
                                                   cpu_backend());

  // What the trainer binds: parameters, their gradients and the loss gradient.
  std::vector<bool> bound(g.graph.values().size(), false);
  for (const auto& [name, id] : g.parameters) {
    bound[static_cast<size_t>(id)] = true;
    bound[static_cast<size_t>(g.graph.value(id).grad)] = true;
  }
  bound[static_cast<size_t>(g.graph.value(g.losses).grad)] = true;
  std::vector<bool> outside = graph::values_outside_plan(g.graph, bound);
  graph::MemoryPlan plan = graph::plan_memory(g.graph, outside);

  MemoryReport report;
  const int64_t parameter_bytes = model.parameter_count() * 4;
  report.parameters = parameter_bytes;
  report.gradients = parameter_bytes * (config.grad_accumulation > 1 ? 2 : 1);
  // ZeRO-1: each rank keeps the moments of its 1/ranks shard.
  const bool zero = config.sync.zero && ranks > 1;
  report.optimizer_state = 2 * (zero ? (model.parameter_count() + ranks - 1) / ranks * 4 : parameter_bytes);
  report.zero_shards = zero ? ranks : 1;
  report.activations = plan.arena_bytes;
  report.activations_unplanned = plan.unplanned_sum_bytes;
  for (size_t v = 0; v < outside.size(); ++v) {
    const graph::Value& value = g.graph.values()[v];
    if (outside[v] && !bound[v]) report.inputs += value.shape.numel() * static_cast<int64_t>(dtype_size(value.dtype));
  }
  // Per thread: attention's (T,T) score gradients, layernorm's and the bias gradients' partial sums.
  report.workspace = static_cast<int64_t>(threads) * (T * T + 2 * C + 4 * C) * 4;
  return report;
}

}  // namespace paraflow::train
