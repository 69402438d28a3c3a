#include "train/memory_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "backend/kernel_args.h"
#include "graph/memory_plan.h"
#include "model/model_files.h"
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
  text += fmt::format("gradients        {}{}\n", mib(gradients),
                      zero_stage >= 2 ? fmt::format("  (ZeRO-{}: this rank's shard and the buckets in flight)", zero_stage) : "");
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
                                      int threads, dist::MeshCoordinates at) {
  const int stage = at.stage;
  const int stages = config.pipeline_parallel;
  const int shards = config.tensor_parallel;
  const int replicas = config.replicas(ranks);
  const int64_t micro_batch = config.micro_batch(ranks);
  const int64_t T = config.sequence_length, C = model.n_embd;
  const model::LayerRange range = partition_layers(model, stages, T, config.stage_layers).at(static_cast<size_t>(stage));
  // (Shard 0 also holds the biases the other shards skip.)
  const model::TensorShard shard{at.tensor, shards};
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
  // This replica's range of the flat buffer (GradientSync's shard_begin / shard_end).
  const int64_t zero_begin = std::min(at.data * zero_shard, parameter_count);
  const int64_t zero_end = std::min(zero_begin + zero_shard, parameter_count);
  const bool whole_accumulator = config.grad_accumulation > 1 && report.zero_stage < 2;
  report.gradients = parameter_bytes * (whole_accumulator ? 2 : 1);
  const bool partitioned = stages > 1 || shards > 1;
  if (report.zero_stage >= 2) {
    // This rank's shard, and the buckets backward has written and not yet reduce-scattered (the
    // trainer's GradientSync overlaps them only where nothing is partitioned).
    dist::GradientSyncConfig sync = config.sync;
    sync.overlap = config.sync.overlap && !partitioned;
    report.gradients_in_flight =
        dist::GradientSync::peak_in_flight_elements(g.graph, gradient_slices(g, part), sync, zero_begin, zero_end) * 4;
    report.gradients = (zero_end - zero_begin) * 4 + report.gradients_in_flight;
  }
  report.optimizer_state = 2 * (report.zero_stage > 0 ? (zero_end - zero_begin) * 4 : parameter_bytes);
  if (report.zero_stage > 0) {
    // GradientSync's staging, a chunk of every rank's shard and one of this rank's, and the copy
    // of a chunk's reduce-scatter input that the engine makes (Gloo's all-reduce of a copy,
    // OpenMPI's temporary); ZeRO-2's shard_sum_.
    const int64_t chunk = std::min(dist::GradientSync::chunk_elements(config.sync.bucket_bytes, replicas), zero_shard);
    report.sync_buffers = (2 * replicas + 1) * chunk * 4;
    if (report.zero_stage >= 2 && config.grad_accumulation > 1) report.sync_buffers += zero_shard * 4;
  }
  if (report.zero_stage >= 3) {
    // This replica's shard, and the layers it gathers (its checkpoint writes its shard only).
    report.parameters = (zero_end - zero_begin) * 4;
    report.gathered_layers = LayerSchedule(g, part).peak_gathered_elements(zero_begin, zero_end) * 4;
  }
  // A checkpoint copies the slices this rank writes out one at a time (Trainer::save_checkpoint):
  // under ZeRO-3 its range of the flat buffer; otherwise the whole part on the first replica, and
  // on the others their range of the moments under ZeRO-1/2 and nothing without ZeRO (measured on
  // GPT-2 Large: ZeRO-1's other replicas never copy wte, 246 MiB).
  const bool writes_part = at.data == 0 && report.zero_stage < 3;
  const int64_t written_begin = writes_part ? 0 : zero_begin;
  const int64_t written_end = writes_part ? parameter_count : report.zero_stage > 0 ? zero_end : 0;
  int64_t largest_slice = 0, offset = 0;
  for (const model::TensorSpec& spec : part) {
    const int64_t end = offset + spec.shape.numel();
    const int64_t written = std::min(end, written_end) - std::max(offset, written_begin);
    largest_slice = std::max(largest_slice, std::max<int64_t>(0, written) * 4);
    offset = end;
  }
  report.checkpoint_extra = largest_slice;
  // A partitioned or ZeRO-3 run's export reads each whole tensor from the last checkpoint's
  // slices: the tensor assembled, and the mapped pages of the slice being copied into it (let go
  // after each; measured on GPT-2 Large: the chief grew by wte plus its slice, 308 MiB on TP4, 505
  // on PP2). A ZeRO-3 slice is at most a replica's shard.
  if (partitioned || report.zero_stage >= 3) {
    std::map<std::string, int64_t> largest_chunk;  // of each tensor, over the stages' first shards
    for (const model::LayerRange& held : partition_layers(model, stages, T, config.stage_layers)) {
      for (const model::TensorSpec& spec : model::part_tensor_specs(model::gpt_tensor_specs(model), held, {0, shards})) {
        const int64_t chunk = report.zero_stage >= 3 ? std::min(spec.shape.numel(), zero_shard) : spec.shape.numel();
        largest_chunk[spec.name] = std::max(largest_chunk[spec.name], chunk);
      }
    }
    for (const model::HfStoredTensor& stored : model::hf_layout(model, model::gpt_tensor_specs(model))) {
      const int64_t tensor = stored.slice.numel();
      report.export_extra = std::max(report.export_extra, (tensor + std::min(tensor, largest_chunk[stored.tensor])) * 4);
    }
  }
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

  // The whole run. Start-up: the part's weights written (ZeRO-3: its shard only) and the moments
  // zeroed; gradients are touched by the first step.
  report.start_up = report.parameters + report.optimizer_state;
  report.run.start_up = report.start_up;
  report.run.step = report.total();
  // Saving keeps the step's buffers (arena, gradients) and copies out one slice at a time. By then
  // ZeRO-2/3 have handed back their buckets' pages outside the shard, and ZeRO-3 the gathered
  // layers (measured on GPT-2 Large: a replica that gathers and reduces wte peaks in its step,
  // 246 MiB under a checkpoint that kept them).
  const int64_t saving = report.total() - report.gradients_in_flight - report.gathered_layers;
  report.run.checkpoint = saving + largest_slice;
  const bool chief = at.tensor == 0 && at.data == 0 && at.stage == 0;
  if (chief) report.run.export_model = saving + report.export_extra;
  return report;
}

int64_t RunPeaks::peak() const { return std::max({start_up, step, checkpoint, export_model}); }

const char* RunPeaks::peak_phase() const {
  const int64_t top = peak();
  if (top == export_model) return "export";
  if (top == checkpoint) return "checkpoint";
  if (top == step) return "step";
  return "start-up";
}

namespace {

// "0", "1-3", "0,2": ascending ranks, runs of consecutive ones joined.
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += fmt::format("{}{}", text.empty() ? "" : ",", ranks[i]);
    if (j > i) text += fmt::format("-{}", ranks[j]);
    i = j + 1;
  }
  return text;
}

// Adds `rank` to the entry with the same role and prediction, or a new one.
void add_rank(std::vector<RankPeaks>& entries, const std::string& role, int rank, const RunPeaks& peaks) {
  for (RankPeaks& entry : entries) {
    if (entry.role == role && entry.peaks == peaks) {
      entry.ranks.push_back(rank);
      return;
    }
  }
  entries.push_back({role, {rank}, peaks});
}

}  // namespace

std::vector<RankPeaks> predict_rank_peaks(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                          int threads) {
  const dist::MeshShape shape = dist::mesh_shape(ranks, config.tensor_parallel, config.pipeline_parallel);
  std::vector<RankPeaks> entries;
  // A rank's prediction depends on its stage, its shard and, under ZeRO, its replica's range
  // (otherwise only on whether it is the chief): estimated once per distinct rank.
  std::map<std::tuple<int, int, int>, RunPeaks> estimated;
  for (int rank = 0; rank < ranks; ++rank) {
    const dist::MeshCoordinates at = dist::mesh_coordinates(shape, rank);
    const std::tuple<int, int, int> kind{at.stage, at.tensor, config.sync.zero > 0 || at.data == 0 ? at.data : 1};
    if (!estimated.count(kind)) estimated[kind] = estimate_training_memory(model, config, ranks, threads, at).run;
    std::string role = rank == 0 ? "chief" : "";
    auto name = [&](int count, const char* what, int index) {
      if (count > 1) role += fmt::format("{}{} {}", role.empty() ? "" : ", ", what, index);
    };
    name(shape.pipeline, "stage", at.stage);
    name(shape.tensor, "shard", at.tensor);
    // (Replicas differ at most in their ZeRO shard: equal predictions share a line.)
    if (role.empty()) role = shape.data > 1 ? "replica" : "rank";
    add_rank(entries, role, rank, estimated[kind]);
  }
  return entries;
}

std::string rank_peaks_table(const std::vector<RankPeaks>& entries, const char* unit) {
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  std::string text = fmt::format("{:<8} {:<26} {:>9} {:>9} {:>10} {:>9} {:>9}  {}\n", unit, "role", "start-up",
                                 "step", "checkpoint", "export", "peak", "peak phase");
  for (const RankPeaks& entry : entries) {
    const RunPeaks& p = entry.peaks;
    text += fmt::format("{:<8} {:<26} {:>9.1f} {:>9.1f} {:>10.1f} {:>9} {:>9.1f}  {}\n", rank_list(entry.ranks),
                        entry.role, mib(p.start_up), mib(p.step), mib(p.checkpoint),
                        p.export_model > 0 ? fmt::format("{:.1f}", mib(p.export_model)) : "-", mib(p.peak()),
                        p.peak_phase());
  }
  return text;
}

}  // namespace paraflow::train
