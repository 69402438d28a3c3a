// Where a training step's bytes go, predicted without training: parameters, gradients,
// optimizer state, activations (the memory plan's arena: activations, values saved for
// backward and their gradients, logits included), inputs and kernel workspace — for one rank,
// or for one pipeline stage's ranks, which hold the activations of every micro-batch in flight.
#pragma once

#include <cstdint>
#include <string>

#include "model/gpt_config.h"
#include "train/trainer.h"

namespace paraflow::train {

struct MemoryReport {
  int64_t parameters = 0;
  int64_t gradients = 0;        // parameter gradients (+ the accumulator with grad_accumulation > 1)
  int64_t optimizer_state = 0;  // AdamW's two moments
  int64_t activations = 0;      // the planned arena
  int64_t activations_unplanned = 0;  // the same values with a buffer each (what planning saves)
  int64_t inputs = 0;           // tokens, targets, the losses
  int64_t workspace = 0;        // per-thread scratch of the kernels
  int64_t sync_buffers = 0;     // ZeRO-1's staging: a whole padded copy of the weights and a shard
  int64_t checkpoint_extra = 0;  // held only while a checkpoint is saved (one slice's copy)
  int zero_shards = 1;          // ranks sharing the optimizer state (ZeRO-1)
  int64_t in_flight = 1;        // micro-batches whose activations a pipeline stage holds at once
  int64_t total() const {
    return parameters + gradients + optimizer_state + activations + inputs + workspace + sync_buffers;
  }
  // What a training step allocates beyond what the trainer holds before its first step.
  int64_t step_allocations() const { return activations + inputs + workspace + sync_buffers; }
  std::string to_text() const;
};

// For one rank of `ranks` (each holds a micro-batch of batch_size / (ranks · grad_accumulation)),
// or, with config.pipeline_parallel stages, for a rank of stage `stage` (micro-batches of
// batch_size / (replicas · dist.micro_batches)), and its first shard with config.tensor_parallel.
MemoryReport estimate_training_memory(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      int threads, int stage = 0);

}  // namespace paraflow::train
