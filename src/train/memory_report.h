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
  int64_t parameters = 0;       // held between steps: ZeRO-3 holds its shard only
  int64_t gradients = 0;        // parameter gradients (+ the accumulator with grad_accumulation > 1, not with ZeRO-2)
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
  // held only while a checkpoint is saved: one slice's copy (and, ZeRO-3, the gathered weights)
  int64_t checkpoint_extra = 0;
  int zero_stage = 0;           // dist.zero in effect (0 with one replica)
  int zero_shards = 1;          // ranks sharing the optimizer state (ZeRO)
  int64_t in_flight = 1;        // micro-batches whose activations a pipeline stage holds at once
  int64_t total() const {
    return parameters + gradients + optimizer_state + activations + inputs + workspace + sync_buffers +
           gathered_layers;
  }
  // What a training step allocates beyond what the trainer holds before its first step.
  int64_t step_allocations() const { return activations + inputs + workspace + sync_buffers + gathered_layers; }
  std::string to_text() const;
};

// For one rank of `ranks` (each holds a micro-batch of batch_size / (ranks · grad_accumulation)),
// or, with config.pipeline_parallel stages, for a rank of stage `stage` (micro-batches of
// batch_size / (replicas · dist.micro_batches)), and its first shard with config.tensor_parallel.
MemoryReport estimate_training_memory(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      int threads, int stage = 0);

}  // namespace paraflow::train
