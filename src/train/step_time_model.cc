#include "train/step_time_model.h"

#include <algorithm>

#include "train/pipeline_schedule.h"

namespace paraflow::train {

double stage_forward_flops_per_token(const model::GptConfig& model, const model::LayerRange& range, int64_t sequence) {
  const double C = static_cast<double>(model.n_embd);
  const double blocks = static_cast<double>(range.end_layer - range.first_layer);
  // Per block: 12·C² weights (2 FLOPs each) and attention's two T-long products (2·T·C, causal).
  const double per_block = 2.0 * 12.0 * C * C + 2.0 * static_cast<double>(sequence) * C;
  const double head = range.last ? 2.0 * C * static_cast<double>(model.vocab_size) : 0.0;
  return blocks * per_block + head;
}

double tensor_parallel_bytes_per_step(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      const model::LayerRange& range) {
  const int t = config.tensor_parallel;
  if (t == 1) return 0;
  const int64_t micro_batches = config.micro_batches_per_step();
  const int64_t micro_batch = config.micro_batch(ranks);
  const double buffers =
      4.0 * static_cast<double>(range.end_layer - range.first_layer) + (range.first ? 1 : 0) + (range.last ? 1 : 0);
  const double positions = static_cast<double>(micro_batch * config.sequence_length);
  const double loss = range.last ? 3.0 * 4.0 * positions : 0.0;
  return static_cast<double>(micro_batches) * (buffers * 4.0 * positions * static_cast<double>(model.n_embd) + loss);
}

StepTimeModel model_step_time(const model::GptConfig& model, const TrainConfig& config, int ranks, double peak_flops,
                              double bandwidth_bytes_per_second, double tensor_bandwidth_bytes_per_second) {
  const int stages = config.pipeline_parallel, shards = config.tensor_parallel;
  const int replicas = config.replicas(ranks);
  const int64_t micro_batches = config.micro_batches_per_step();
  const int64_t micro_batch = config.micro_batch(ranks);
  const int64_t T = config.sequence_length;
  const double tokens = static_cast<double>(micro_batch * T);
  const std::vector<model::LayerRange> ranges = partition_layers(model, stages, T, config.stage_layers);
  double slowest = 0;  // seconds per micro-batch, forward and backward
  double largest_stage_bytes = 0, largest_tensor_bytes = 0;
  for (const model::LayerRange& range : ranges) {
    slowest = std::max(slowest, 3.0 * stage_forward_flops_per_token(model, range, T) * tokens / shards / peak_flops);
    const int64_t count = model::element_count(model::part_tensor_specs(model::gpt_tensor_specs(model), range, {0, shards}));
    largest_stage_bytes = std::max(largest_stage_bytes, 4.0 * static_cast<double>(count));
    largest_tensor_bytes = std::max(largest_tensor_bytes, tensor_parallel_bytes_per_step(model, config, ranks, range));
  }
  StepTimeModel time;
  time.compute = static_cast<double>(micro_batches) * slowest;
  time.bubble = static_cast<double>(stages - 1) * slowest;
  if (stages > 1) {
    // Each step of the pipeline's critical path sends a (micro_batch, T, C) activation one way
    // and its gradient the other.
    const double boundary = 4.0 * tokens * static_cast<double>(model.n_embd);
    time.pipeline_transfers =
        2.0 * static_cast<double>(micro_batches + stages - 1) * boundary / bandwidth_bytes_per_second;
  }
  time.tensor_all_reduce = 2.0 * (shards - 1) / shards * largest_tensor_bytes / tensor_bandwidth_bytes_per_second;
  const double ring = 2.0 * (replicas - 1) / replicas * largest_stage_bytes / bandwidth_bytes_per_second;
  // Without model parallelism the all-reduce overlaps backward (2/3 of the compute); a pipeline
  // or sharded model runs it after.
  time.gradient_all_reduce =
      stages > 1 || shards > 1 ? ring : std::max(0.0, ring - time.compute * 2.0 / 3.0);
  return time;
}

}  // namespace paraflow::train
