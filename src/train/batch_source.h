// Where the trainer's batches come from. Global batch `index` is defined for all ranks at once;
// a caller takes slice s of S of it (data-parallel rank r with accumulation step m takes slice
// r·accumulation + m), so the rows a step sees do not depend on how they are split.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "graph/executor.h"
#include "model/gpt_graph.h"
#include "tensor/tensor.h"

namespace paraflow::train {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills tokens and targets (B,T) i32, host tensors, with rows [slice·B, (slice+1)·B) of global
  // batch `index` (B·slices rows) of the train or validation split.
  virtual void batch(int64_t index, uint64_t seed, bool validation, int64_t slice, int64_t slices,
                     const Tensor& tokens, const Tensor& targets) = 0;
  virtual int32_t max_token() const = 0;
  // Whether the source refuses ids of `vocab_size` or more itself as it reads them (naming the
  // file and record), so that nothing has to read all of it ahead to check.
  virtual bool refuses_tokens_past(int64_t vocab_size) const { (void)vocab_size; return false; }
  virtual std::string describe() const = 0;
  // The train split's iterator position, stored in checkpoints (empty for stateless sources).
  virtual nlohmann::json state() const { return nlohmann::json::object(); }
  virtual void restore(const nlohmann::json& state) { (void)state; }
  // Seconds callers have waited for train batches so far (a streaming source's stall time).
  virtual double wait_seconds() const { return 0; }
};

struct BatchPosition {
  int64_t index;
  uint64_t seed;
  bool validation;
  int64_t slice, slices;
};

// Refuses data holding a token id past the model's vocabulary (its embedding and loss have no
// row for it), naming both; a source that refuses such ids as it reads them is left to do so.
void check_tokens_fit(const BatchSource& data, int64_t vocab_size);

// The mean of the graph's per-position losses after a forward pass (accumulated in double).
double mean_loss(graph::Executor& executor, const model::GptGraph& graph);

// Uploads the batch at `position` into the graph's tokens and targets, runs the forward pass
// and returns mean_loss.
double forward_batch(graph::Executor& executor, const model::GptGraph& graph, BatchSource& data,
                     const BatchPosition& position);

}  // namespace paraflow::train
