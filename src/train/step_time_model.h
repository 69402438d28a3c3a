// A layout's step time, modelled before launching: each pipeline stage's compute per micro-batch
// (forward and backward: 3x the forward's FLOPs, divided over the tensor-parallel shards, at a
// GEMM peak), the pipeline's fill and drain (the bubble), the blocking transfers between stages,
// the shards' all-reduces and the replicas' gradient all-reduce (rings, at a link bandwidth).
// A planning aid; bench/ measures.
#pragma once

#include "model/gpt_config.h"
#include "train/trainer.h"

namespace paraflow::train {

struct StepTimeModel {
  double compute = 0;             // the slowest stage's micro-batches
  double bubble = 0;              // that stage idle while the pipeline fills and drains
  double pipeline_transfers = 0;  // activations and their gradients between stages
  double tensor_all_reduce = 0;   // the shards' all-reduces of activations and their gradients
  double gradient_all_reduce = 0; // exposed: after the pipeline; with one stage, what backward does not hide
  double total() const { return compute + bubble + pipeline_transfers + tensor_all_reduce + gradient_all_reduce; }
};

// Forward FLOPs per token of a pipeline stage (a range from partition_layers): its blocks' GEMMs
// and attention, and the head's GEMM on the last stage.
double stage_forward_flops_per_token(const model::GptConfig& model, const model::LayerRange& range, int64_t sequence);

// Bytes a shard hands to a step's tensor-parallel all-reduces (a ring then moves 2(t-1)/t of
// them through each link): per micro-batch and block, two (micro-batch, T, C) f32 buffers in
// forward (after attention and the MLP) and two in backward (their inputs' gradients); one each
// for the embedding (forward) and the head (backward); and the vocabulary-parallel loss's row
// maxima and sums, 3 floats per position.
double tensor_parallel_bytes_per_step(const model::GptConfig& model, const TrainConfig& config, int ranks,
                                      const model::LayerRange& range);

// `tensor_bandwidth` is the shards' links (they are consecutive ranks: one node's, NVLink's on GPUs).
StepTimeModel model_step_time(const model::GptConfig& model, const TrainConfig& config, int ranks, double peak_flops,
                              double bandwidth_bytes_per_second, double tensor_bandwidth_bytes_per_second);

}  // namespace paraflow::train
