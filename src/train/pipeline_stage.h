// One stage of a pipeline-parallel model, on this rank: its part of the training graph, one
// executor per micro-batch it may hold at once (a slot: its activations stay until that
// micro-batch's backward), and the schedule that runs them in step with the stages before and
// after it, through the pipeline group's send/recv. Every slot binds the same parameters and
// gradients, so a step's micro-batches accumulate their gradients in one buffer.
#pragma once

#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "graph/executor.h"
#include "model/gpt_graph.h"
#include "train/batch_source.h"
#include "train/pipeline_schedule.h"

namespace paraflow::train {

// Where the last train() or evaluate() spent its time on this stage.
struct PipelineTiming {
  double compute = 0;    // forward and backward passes
  double transfers = 0;  // sending, receiving and waiting: for the neighbours, and at the end for every stage
};

struct PipelineLayout {
  int stages = 1, stage = 0;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t micro_batches = 1;
};

class PipelineStage {
 public:
  // `graph` (built for this stage's model::LayerRange) must outlive the stage; `group` ranks
  // the stages in order; `tensor_group` is the tensor-parallel group of a sharded stage.
  PipelineStage(const model::GptGraph& graph, PipelineLayout layout, Backend& backend, dist::Communicator& group,
                graph::CollectiveGroup* tensor_group = nullptr);

  // Binds every slot to the stage's parameters, their gradients and their 16-bit copies.
  void bind(const model::ParameterSet& parameters, const model::ParameterSet& gradients,
            const model::ParameterSet& half_parameters);

  // Forward and backward of the step's micro-batches: micro-batch k is slice first.slice + k of
  // first.slices. `loss_weight` is d(objective)/d(each position's loss). Gradients add to the
  // bound ones. Returns the sum of the micro-batches' mean losses on the last stage, else 0.
  double train(BatchSource& data, const BatchPosition& first, float loss_weight);
  // Forwards only, on the same slices; the same return value.
  double evaluate(BatchSource& data, const BatchPosition& first);

  const PipelineLayout& layout() const { return layout_; }
  const PipelineTiming& last_timing() const { return timing_; }
  bool first() const { return layout_.stage == 0; }
  bool last() const { return layout_.stage == layout_.stages - 1; }

 private:
  double run(BatchSource& data, const BatchPosition& first, bool train);
  // Micro-batch `micro`'s slot: 1F1B finishes micro-batches in order, so micro and micro + slots
  // are never held at once.
  size_t slot_of(int64_t micro) const { return static_cast<size_t>(micro % static_cast<int64_t>(slots_.size())); }
  // Feeds the slot's tokens (first stage) and targets (last stage) from the data.
  void load_batch(size_t slot, BatchSource& data, const BatchPosition& position);
  void transfer(const PipelineInstruction& instruction);
  const Tensor& message_tensor(const PipelineMessage& message, bool outgoing);

  const model::GptGraph& graph_;
  PipelineLayout layout_;
  Backend& backend_;
  dist::Communicator& group_;
  std::vector<std::unique_ptr<graph::Executor>> slots_;
  std::vector<Tensor> output_grads_;  // per slot: d(objective)/d(stage output), from the next stage
  Tensor loss_grad_;                  // last stage: the loss weight at every position
  Tensor host_tokens_, host_targets_;
  PipelineTiming timing_;
};

}  // namespace paraflow::train
