#include "train/memory_report.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/kernel_args.h"
#include "graph/memory_plan.h"
#include "train/pipeline_schedule.h"
#include "train/sharded_parameters.h"
#include "train/training_graph.h"

namespace paraflow::train {

namespace {

std::string mib(int64_t bytes) { return fmt::format("{:9.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

std::string MemoryReport::to_text() const {
  std::string text;
  text += fmt::format("parameters       {}{}\n", mib(parameters), zero_stage >= 3 ? "  (ZeRO-3: this rank's shard)" : "");
  text += fmt::format("gradients        {}\n", mib(gradients));
  text += fmt::format("optimizer state  {}  (AdamW moments{})\n", mib(optimizer_state),
                      zero_shards > 1 ? fmt::format(", ZeRO-{}: 1/{} each", zero_stage, zero_shards) : "");
  text += fmt::format("activations      {}  (planned arena{}; {} with a buffer per value)\n", mib(activations),
                      in_flight > 1 ? fmt::format(" x {} micro-batches in flight", in_flight) : "",
                      mib(activations_unplanned));
  text += fmt::format("inputs, losses   {}\n", mib(inputs));
  text += fmt::format("workspace        {}\n", mib(workspace));
  if (gathered_layers > 0) {
    text += fmt::format("gathered layers  {}  (ZeRO-3: other ranks' parts of the layers in use and the next one)\n",
                        mib(gathered_layers));
  }
  if (sync_buffers > 0) {
    text += fmt::format("gradient sync    {}  (ZeRO-{}: staging of about two buckets{})\n", mib(sync_buffers), zero_stage,
                        zero_stage >= 2 ? ", and this rank's shard of the accumulated gradients" : "");
  }
  text += fmt::format("total            {}\n", mib(total()));
  if (checkpoint_extra > 0) {
    text += fmt::format("+ while saving   {}  (a checkpoint copies out one slice at a time)\n", mib(checkpoint_extra));
  }
  return text;
}

MemoryReport estimate_training_memory(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      int threads, int stage) {
  const int stages = config.pipeline_parallel;
  const int shards = config.tensor_parallel;
  const int replicas = config.replicas(ranks);
  const int64_t micro_batch = config.micro_batch(ranks);
  const int64_t T = config.sequence_length, C = model.n_embd;
  const model::LayerRange range = partition_layers(model, stages, T, config.stage_layers).at(static_cast<size_t>(stage));
  // Shard 0: it also holds the biases the other shards skip.
  const model::TensorShard shard{0, shards};
  model::GptGraph g =
      build_training_graph(model, micro_batch, T, config.recompute, config.precision, cpu_backend(), range, shard);

  // What the trainer binds: parameters, their gradients and the gradient of the graph's end (the
  // loss, or a stage's output); a stage also keeps what crosses to its neighbours.
  std::vector<bool> bound(g.graph.values().size(), false), kept(g.graph.values().size(), false);
  for (const auto& [name, id] : g.parameters) {
    bound[static_cast<size_t>(id)] = true;
    bound[static_cast<size_t>(g.graph.value(id).grad)] = true;
  }
  const graph::ValueId end = range.last ? g.losses : g.stage_output;
  bound[static_cast<size_t>(g.graph.value(end).grad)] = true;
  if (!range.last) kept[static_cast<size_t>(end)] = true;
  if (!range.first) {
    kept[static_cast<size_t>(g.stage_input)] = true;
    kept[static_cast<size_t>(g.graph.value(g.stage_input).grad)] = true;
  }
  std::vector<bool> owned(bound.size());
  for (size_t v = 0; v < owned.size(); ++v) owned[v] = bound[v] || kept[v];
  std::vector<bool> outside = graph::values_outside_plan(g.graph, owned);
  graph::MemoryPlan plan = graph::plan_memory(g.graph, outside);

  MemoryReport report;
  report.in_flight = stages > 1 ? pipeline_in_flight(config.pipeline_schedule, stages, stage, config.micro_batches) : 1;
  const std::vector<model::TensorSpec> part = model::part_tensor_specs(model::gpt_tensor_specs(model), range, shard);
  const int64_t parameter_count = model::element_count(part);
  const int64_t parameter_bytes = parameter_count * 4;
  report.parameters = parameter_bytes;
  // ZeRO: each rank keeps the moments of its 1/replicas shard (and, ZeRO-2, sums its micro-batches
  // there rather than in a whole accumulator).
  report.zero_stage = replicas > 1 ? config.sync.zero : 0;
  report.zero_shards = report.zero_stage > 0 ? replicas : 1;
  const int64_t zero_shard = (parameter_count + replicas - 1) / replicas;
  const bool whole_accumulator = config.grad_accumulation > 1 && report.zero_stage < 2;
  report.gradients = parameter_bytes * (whole_accumulator ? 2 : 1);
  report.optimizer_state = 2 * (report.zero_stage > 0 ? zero_shard * 4 : parameter_bytes);
  if (report.zero_stage > 0) {
    // GradientSync's staging, a chunk of every rank's shard and one of this rank's, and the copy
    // of a chunk's reduce-scatter input that the engine makes (Gloo's all-reduce of a copy,
    // OpenMPI's temporary); ZeRO-2's shard_sum_.
    const int64_t chunk = std::min(dist::GradientSync::chunk_elements(config.sync.bucket_bytes, replicas), zero_shard);
    report.sync_buffers = (2 * replicas + 1) * chunk * 4;
    if (report.zero_stage >= 2 && config.grad_accumulation > 1) report.sync_buffers += zero_shard * 4;
  }
  if (report.zero_stage >= 3) {
    // Rank 0's shard, and the layers it gathers (its checkpoint writes its shard only).
    report.parameters = zero_shard * 4;
    report.gathered_layers = LayerSchedule(g, part).peak_gathered_elements(0, zero_shard) * 4;
  }
  // A checkpoint copies this rank's slices out one at a time: at most its largest tensor.
  for (const model::TensorSpec& spec : part) report.checkpoint_extra = std::max(report.checkpoint_extra, spec.shape.numel() * 4);
  // Every micro-batch in flight has an executor of its own.
  report.activations = plan.arena_bytes * report.in_flight;
  report.activations_unplanned = plan.unplanned_sum_bytes * report.in_flight;
  for (size_t v = 0; v < outside.size(); ++v) {
    const graph::Value& value = g.graph.values()[v];
    const int64_t bytes = static_cast<int64_t>(dtype_bytes(value.dtype, value.shape.numel()));
    if (outside[v] && !bound[v]) report.inputs += bytes * report.in_flight;
  }
  // Per thread: the CPU attention's scratch (a block's scores and their gradients,
  // (kAttentionBlockRows, T) f32 each, and in bf16 the two rounded to bf16 and one head's dq, dk,
  // dv summed in f32), layernorm's and the bias gradients' partial sums.
  const int64_t head_size = model.head_size();
  const bool bf16 = config.precision == graph::PrecisionPolicy::mixed_bfloat16 &&
                    cpu_backend().supports(KernelOp::attention_forward, DType::bf16);
  const int64_t attention_floats = (bf16 ? 3 : 2) * kAttentionBlockRows * T + (bf16 ? 3 * T * head_size : 0);
  const int64_t floats_per_thread = attention_floats + 2 * C + 4 * C;
  report.workspace = static_cast<int64_t>(threads) * floats_per_thread * 4;
  return report;
}

}  // namespace paraflow::train
