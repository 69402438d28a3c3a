// Where a training step's bytes go, predicted without training: parameters, gradients,
// optimizer state, activations (the memory plan's arena: activations, values saved for
// backward and their gradients, logits included), inputs and kernel workspace — for one rank,
// or for one pipeline stage's ranks, which hold the activations of every micro-batch in flight;
// and each rank's peak over a whole run (start-up, steps, checkpoints, the export).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/mesh.h"
#include "model/gpt_config.h"
#include "train/trainer.h"

namespace paraflow::train {

// A rank's resident bytes at the peak of each phase of a whole `paraflow train` run (what its peak
// RSS grows by over a process with no model); the largest is the rank's peak.
struct RunPeaks {
  int64_t start_up = 0;      // its part initialised, or read from a checkpoint's slices
  int64_t step = 0;          // a training step
  int64_t checkpoint = 0;    // writing its slices of a checkpoint
  int64_t export_model = 0;  // the chief writing the export; 0 on the other ranks
  int64_t peak() const;
  const char* peak_phase() const;
  bool operator==(const RunPeaks&) const = default;
};

struct MemoryReport {
  int64_t parameters = 0;       // held between steps: ZeRO-3 holds its shard only
  int64_t gradients = 0;        // parameter gradients (+ the accumulator with grad_accumulation > 1); ZeRO-2: its shard + the buckets in flight
  int64_t gradients_in_flight = 0;  // ZeRO-2/3: the buckets' part of `gradients`, handed back once reduce-scattered
  int64_t optimizer_state = 0;  // AdamW's two moments
  int64_t activations = 0;      // the planned arena
  int64_t activations_unplanned = 0;  // the same values with a buffer each (what planning saves)
  int64_t inputs = 0;           // tokens, targets, the losses
  int64_t workspace = 0;        // per-thread scratch of the kernels
  // ZeRO's staging, about two buckets of chunks (and ZeRO-2's shard of the accumulated gradients)
  int64_t sync_buffers = 0;
  // ZeRO-3: the most bytes of other ranks' parameters gathered at once (layers in use and the
  // next one prefetched)
  int64_t gathered_layers = 0;
  // held only while a checkpoint is saved: one slice's copy
  int64_t checkpoint_extra = 0;
  // held only while the chief writes the export: a partitioned or ZeRO-3 run streams it from the
  // last checkpoint, one whole tensor at a time
  int64_t export_extra = 0;
  // resident once the part is initialised or read back, before the first step: its weights
  // (ZeRO-3: its shard only) and moments
  int64_t start_up = 0;
  RunPeaks run;                 // this rank's whole run, phase by phase
  int zero_stage = 0;           // dist.zero in effect (0 with one replica)
  int zero_shards = 1;          // ranks sharing the optimizer state (ZeRO)
  int64_t in_flight = 1;        // micro-batches whose activations a pipeline stage holds at once
  int64_t total() const {
    return parameters + gradients + optimizer_state + activations + inputs + workspace + sync_buffers +
           gathered_layers;
  }
  // What a training step allocates beyond what the trainer holds before its first step (ZeRO-2's
  // gradients too: their pages are written by backward only).
  int64_t step_allocations() const {
    return activations + inputs + workspace + sync_buffers + gathered_layers + (zero_stage >= 2 ? gradients : 0);
  }
  std::string to_text() const;
};

// The ranks (or parameter-server tasks) that share one prediction.
struct RankPeaks {
  std::string role;        // "stage 0 shard 1", "chief", "worker", "ps"
  std::vector<int> ranks;  // mpirun ranks, or task indices of the role
  RunPeaks peaks;
};

// Every rank of a job of `ranks` processes (mpirun or TF_CONFIG without ps tasks), in rank order,
// ranks with identical predictions on one entry.
std::vector<RankPeaks> predict_rank_peaks(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                          int threads);
// A table: ranks (`unit`: "tasks" for a parameter-server job's), role, each phase's MiB, the peak
// and its phase.
std::string rank_peaks_table(const std::vector<RankPeaks>& ranks, const char* unit = "ranks");

// For one rank of `ranks` (each holds a micro-batch of batch_size / (ranks · grad_accumulation)),
// or, with config.pipeline_parallel stages, for a rank of stage `at.stage` (micro-batches of
// batch_size / (replicas · dist.micro_batches)), shard `at.tensor` with config.tensor_parallel,
// replica `at.data` (its ZeRO shard); the chief (all coordinates 0) also writes the export.
MemoryReport estimate_training_memory(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      int threads, dist::MeshCoordinates at = {});

}  // namespace paraflow::train
