// Evaluation on the validation split: mean loss and perplexity of a model, and the evaluator
// role — following a run's checkpoint directory, evaluating each new checkpoint once, writing
// TensorBoard summaries under <out_dir>/eval, and remembering what it did so a restarted
// evaluator carries on where it stopped.
#pragma once

#include <atomic>
#include <filesystem>

#include "graph/executor.h"
#include "model/gpt_graph.h"
#include "train/token_source.h"
#include "train/trainer.h"

namespace paraflow::train {

struct EvalResult {
  double loss = 0;
  double perplexity = 0;
};

class Evaluator {
 public:
  // Evaluates train.eval_batches validation batches of `train`'s size, each in the slices training
  // splits it into on one process (its micro-batches: train.grad_accumulation or
  // dist.micro_batches), so that evaluating needs no more memory than a training step.
  Evaluator(const model::GptConfig& config, BatchSource& data, Backend& backend, const TrainConfig& train);

  // Loads the weights of a checkpoint (verified against its manifest) or export dir and
  // evaluates them.
  EvalResult evaluate_dir(const std::filesystem::path& model_dir);
  EvalResult evaluate(const model::ParameterSet& parameters);

  // The graph one slice runs through.
  const model::GptGraph& gpt_graph() const { return graph_; }

  // Watches `run_dir` until a checkpoint at `final_step` has been evaluated or *stop is set.
  void watch(const std::filesystem::path& run_dir, int64_t final_step, const std::atomic<bool>* stop,
             double poll_seconds = 2.0);

 private:
  model::GptConfig config_;
  BatchSource& data_;
  Backend& backend_;
  int64_t batches_, slices_;
  uint64_t seed_;
  model::GptGraph graph_;
  model::ParameterSet parameters_;
  std::unique_ptr<graph::Executor> executor_;
};

}  // namespace paraflow::train
