// A layout's step time, modelled before launching: each pipeline stage's compute per micro-batch
// (forward and backward: 3x the forward's FLOPs, at a GEMM peak), the pipeline's fill and drain
// (the bubble), the blocking transfers between stages and the replicas' gradient all-reduce (a
// ring, at a link bandwidth). A planning aid; bench/ measures.
#pragma once

#include "model/gpt_config.h"
#include "train/trainer.h"

namespace paraflow::train {

struct StepTimeModel {
  double compute = 0;             // the slowest stage's micro-batches
  double bubble = 0;              // that stage idle while the pipeline fills and drains
  double pipeline_transfers = 0;  // activations and their gradients between stages
  double gradient_all_reduce = 0; // exposed: after the pipeline; with one stage, what backward does not hide
  double total() const { return compute + bubble + pipeline_transfers + gradient_all_reduce; }
};

// Forward FLOPs per token of a pipeline stage: its blocks' GEMMs and attention, and the head's
// GEMM on the last stage.
double stage_forward_flops_per_token(const model::GptConfig& model, const model::LayerRange& range, int64_t sequence);

StepTimeModel model_step_time(const model::GptConfig& model, const TrainConfig& config, int ranks, double peak_flops,
                              double bandwidth_bytes_per_second);

}  // namespace paraflow::train
