// The training loop on one process: builds the GPT graph with its backward pass, runs
// forward/backward over gradient-accumulation micro-batches, clips, applies AdamW on the
// schedule, evaluates, checkpoints, and resumes exactly from the latest valid checkpoint.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>

#include "base/config.h"
#include "dist/communicator.h"
#include "dist/gradient_sync.h"
#include "dist/mesh.h"
#include "graph/executor.h"
#include "graph/precision.h"
#include "model/gpt_graph.h"
#include "train/checkpoint.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "train/pipeline_stage.h"
#include "train/schedule.h"
#include "train/sharded_parameters.h"
#include "train/token_source.h"

namespace paraflow::train {

struct TrainConfig {
  int64_t batch_size = 8;  // sequences per optimizer step, over all ranks and micro-batches
  int64_t sequence_length = 256;
  int64_t steps = 1000;        // the schedule's length
  int64_t stop_at_step = 0;    // > 0: checkpoint and exit at this step (a session of a longer run)
  int64_t grad_accumulation = 1;
  LrSchedule schedule;
  AdamWConfig adamw;
  uint64_t seed = 1337;
  std::filesystem::path out_dir = "runs/default";
  int64_t checkpoint_every = 0;  // 0: only at the end
  int keep_checkpoints = 3;
  int64_t log_every = 10;
  int64_t eval_every = 0;
  int64_t eval_batches = 8;
  dist::GradientSyncConfig sync;
  // Tensor and pipeline parallelism: shards per layer, stages per model replica, micro-batches per
  // step on each replica, the schedule, and the blocks of each stage (empty: balanced).
  int tensor_parallel = 1;  // shards of each layer (Megatron-style: heads, MLP columns and rows)
  int pipeline_parallel = 1;
  int64_t micro_batches = 4;
  PipelineSchedule pipeline_schedule = PipelineSchedule::one_f_one_b;
  std::vector<int64_t> stage_layers;
  std::filesystem::path tokenizer_dir;  // copied into exports when set
  std::string recompute = "none";       // gradient checkpointing: none | block | attention | op kinds
  bool decay_embeddings = false;        // AdamW weight decay on wte/wpe too
  graph::PrecisionPolicy precision = graph::PrecisionPolicy::float32;
  double initial_loss_scale = 32768.0;  // mixed_float16's dynamic loss scale starts here (2^15)
  // Resuming from a checkpoint made with other model or optimizer settings is refused unless forced.
  bool force_resume = false;

  static TrainConfig from_config(const Config& config);  // keys train.*

  // Micro-batches per step on each data-parallel replica: a pipeline's, or the accumulation's.
  int64_t micro_batches_per_step() const { return pipeline_parallel > 1 ? micro_batches : grad_accumulation; }
  // Data-parallel replicas of a job of `ranks`, and the sequences of each micro-batch.
  int replicas(int ranks) const { return ranks / (tensor_parallel * pipeline_parallel); }
  int64_t micro_batch(int ranks) const { return batch_size / (replicas(ranks) * micro_batches_per_step()); }
  // Refuses, naming the keys, a batch that does not split into replicas x micro-batches.
  void check_batch_split(int ranks) const;
};

// The settings that change the maths of a run (model, optimizer, schedule, data order), recorded
// in checkpoints and compared on resume.
nlohmann::json run_settings(const model::GptConfig& model_config, const TrainConfig& config);
// What every rank of a training group must share, under its config keys: run_settings, and what
// shapes the sequence of collectives (the parallel layout, the buckets, and the steps that log,
// evaluate, checkpoint and stop).
nlohmann::json group_settings(const model::GptConfig& model_config, const TrainConfig& config);
// Refuses, on every rank, a group whose ranks run other settings than the chief's (the trainer
// adds its data's state, so ranks also agree on the corpus and its split): each such rank
// names the keys and both values, the others name the ranks. (A collective over mismatched
// settings would hang, or fail in MPI or Gloo without naming the setting.)
void check_group_settings(dist::Communicator& communicator, const nlohmann::json& settings);
// Refuses to resume `checkpoint` (its trainer state `state`) with other settings than these,
// naming each change, unless config.force_resume.
void check_resumable(const std::filesystem::path& checkpoint, const nlohmann::json& state,
                     const model::GptConfig& model_config, const TrainConfig& config);

// This process's peak resident memory so far.
int64_t peak_rss_bytes();

// The process-wide single-rank communicator.
dist::Communicator& local_communicator();

struct StepStats {
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0;
  bool skipped = false;  // mixed_float16: the gradients overflowed and the update was skipped
  double communication_wait = 0;  // seconds backward's end waited for gradient all-reduces
  PipelineTiming pipeline;         // pipeline runs: this stage's compute and transfer seconds
  // Tensor-parallel runs: bytes this rank handed to the shards' all-reduces, and their seconds.
  int64_t tensor_parallel_bytes = 0;
  double tensor_parallel_seconds = 0;
};

// One process of a (possibly) data- and pipeline-parallel run. With one stage, the
// communicator's rank r trains on slice r of every global batch. With p stages, the ranks form a
// mesh of p stages x d replicas (dist/mesh.h): replica r trains on slices [r·m, (r+1)·m) of
// d·m, its stages passing activations and gradients micro-batch by micro-batch. Every rank
// initialises (from per-tensor random streams) or loads only its own part, and writes its own
// slices of each checkpoint (train/checkpoint.h), so no rank ever holds the whole model and any
// layout resumes any other; the chief commits checkpoints and streams exports from them.
class Trainer {
 public:
  Trainer(model::GptConfig model_config, TrainConfig config, BatchSource& data, Backend& backend,
          dist::Communicator& communicator);
  Trainer(model::GptConfig model_config, TrainConfig config, BatchSource& data, Backend& backend)
      : Trainer(model_config, std::move(config), data, backend, local_communicator()) {}

  // Fresh GPT-2 initialisation from the seed, or the latest valid checkpoint in out_dir (chosen
  // by the chief; every rank reads its own slices). Returns true when it resumed.
  bool initialize_or_resume();

  StepStats step();
  double evaluate(int64_t batches);
  // Every rank calls it and writes its own slices; the chief commits and returns the checkpoint,
  // the others return {}.
  std::filesystem::path save_checkpoint();
  // The chief's: the model it holds, or for a partitioned run, streamed tensor by tensor from its
  // last checkpoint.
  void export_model(const std::filesystem::path& dir) const;

  // Steps until `config.steps` or until *stop becomes true (SIGTERM), printing progress;
  // always ends with a checkpoint and an export in out_dir/export.
  void run(const std::atomic<bool>* stop, double peak_flops);

  int64_t current_step() const { return step_; }
  const LossScaler& loss_scaler() const { return loss_scaler_; }
  bool scales_loss() const { return config_.precision == graph::PrecisionPolicy::mixed_float16; }
  // This rank's parameters: the whole model's, or its pipeline stage's.
  model::ParameterSet& parameters() { return parameters_; }
  model::ParameterSet& gradients() { return gradients_; }
  const model::GptGraph& gpt_graph() const { return graph_; }
  // The executor of a run without pipeline stages (profiling, memory plans).
  graph::Executor& executor() {
    check(executor_ != nullptr, "a pipeline stage runs one executor per micro-batch slot");
    return *executor_;
  }

 private:
  bool pipelined() const { return config_.pipeline_parallel > 1; }
  // Ranks hold parts of the model (stages, shards): the chief scatters and gathers them.
  bool partitioned() const { return mesh_ != nullptr; }
  bool tensor_parallel() const { return config_.tensor_parallel > 1; }
  // The ranks holding the same part of the model as this one: their gradients are averaged.
  dist::Communicator& replicas() const { return mesh_ ? *mesh_->data : communicator_; }
  // Sums over every rank of the job (for a pipeline, directly: the gradient thread is idle then).
  float job_sum(float value);
  float job_max(float value);
  std::string broadcast_text(const std::string& text);  // the chief's text to every rank
  float loss_weight() const;  // d(objective)/d(each position's loss) of a micro-batch
  double pipeline_step();
  // Sums the tied embedding's gradient between the first and the last stage, which both hold it.
  void sum_tied_embedding_gradients();
  // Sums the partial gradients over the tensor-parallel shards that hold them: the row-split
  // layers' biases (shard 0's), replicated k/v heads (each shard's through its own q heads).
  void sum_partial_gradients();
  // Whether tensor `name` is the last stage's copy of the tied embedding, which the gradient norm
  // and checkpoints leave to the first stage's (copies between shards: model::shard_slices).
  bool holds_tied_copy(const std::string& name) const;
  // The squared norm of this rank's gradients that it counts for the job: its ZeRO-1 shard, less
  // the elements another rank counts (a stage's tied embedding copy, whole tensors and replicated
  // k/v heads on their first shard).
  double counted_squares(const Tensor& gradients) const;
  // Rewrites the 16-bit weight copies from the f32 master weights (after loading or gathering them).
  void refresh_half_parameters();
  bool is_chief() const { return communicator_.rank() == 0; }
  // Every rank waits here (up to 30 minutes, past dist.timeout_seconds) while ranks write their
  // slices of a checkpoint, or the chief alone verifies or commits one.
  void wait_for_checkpoint_io();
  // ZeRO stage 1 or more in effect: each replica keeps and updates one shard of the optimizer state.
  bool shards_optimizer_state() const { return config_.sync.zero >= 1 && replicas().size() > 1; }
  // ZeRO stage 2 in effect: each replica also sums the micro-batches' gradients of its shard only.
  bool shards_gradients() const { return config_.sync.zero >= 2 && replicas().size() > 1; }
  // ZeRO stage 3 in effect: each replica also holds its shard of the parameters only.
  bool shards_parameters() const { return config_.sync.zero >= 3 && replicas().size() > 1; }
  // Every rank's growth of peak RSS since `rss_before`: the chief prints the largest and its rank.
  void report_peak_growth(int64_t rss_before);
  // Every rank's growth of peak RSS since the trainer began (before its model existed), in rank
  // order: start-up, steps and checkpoints so far (all of them on every rank).
  std::vector<float> whole_run_peak_growth();
  // The chief, after the export: the largest whole-run growth and its rank, and every rank's.
  void report_whole_run_peaks(std::vector<float> growth);
  // Forward and backward on this rank's slice `micro` of global batch `index`; returns the
  // slice's mean loss.
  double forward_backward(int64_t index, int64_t micro);
  // Where the step's summed gradients are (of this rank's shard only, under ZeRO).
  model::ParameterSet& final_gradients() { return accumulated_.specs().empty() ? gradients_ : accumulated_; }

  model::GptConfig model_config_;
  TrainConfig config_;
  BatchSource& data_;
  Backend& backend_;
  model::GptGraph graph_;
  dist::Communicator& communicator_;
  std::unique_ptr<dist::MeshGroups> mesh_;  // partitioned runs: this rank's groups
  std::vector<model::LayerRange> stage_ranges_;  // partitioned runs: every stage's blocks
  model::LayerRange range_;                 // this rank's part of the model: its stage's blocks
  model::TensorShard shard_;                // and its shard of them
  std::unique_ptr<graph::CollectiveGroup> tensor_group_;
  std::vector<model::TensorSpec> whole_specs_;
  int64_t micro_batch_ = 0;
  model::ParameterSet parameters_, gradients_, accumulated_;
  // The 16-bit weights the GEMMs read under a mixed policy (empty under float32), rewritten by
  // the optimizer from the f32 master weights in parameters_.
  model::ParameterSet half_parameters_;
  std::unique_ptr<graph::Executor> executor_;  // one stage
  std::unique_ptr<PipelineStage> pipeline_;     // pipeline runs
  // The chief: the checkpoint it last committed (a partitioned run's export reads it).
  std::filesystem::path last_checkpoint_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<dist::GradientSync> sync_;
  std::unique_ptr<ShardedParameters> sharded_parameters_;  // ZeRO-3
  LossScaler loss_scaler_;  // used with mixed_float16 only
  CheckpointManager checkpoints_;
  Tensor loss_grad_;
  int64_t step_ = 0;
  int64_t rss_at_start_ = 0;  // peak RSS before the model was built
};

// The type the GEMMs of a training step multiply in under `policy`: its 16-bit storage type
// where the backend has matmul kernels for it, else f32 (the policy then only stores in 16 bits).
DType gemm_dtype(graph::PrecisionPolicy policy, const Backend& backend);
// Measured GEMM throughput of `backend` on an n³ product with `dtype` operands (f32 results), in FLOP/s.
double measure_peak_flops(Backend& backend, int64_t n = 1024, DType dtype = DType::f32);

}  // namespace paraflow::train
