// Where the trainer's batches come from. Global batch `index` is defined for all ranks at once;
// a caller takes slice s of S of it (data-parallel rank r with accumulation step m takes slice
// r·accumulation + m), so the rows a step sees do not depend on how they are split.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace paraflow::train {

// The mean of a (B,T) tensor of per-position losses, accumulated in double.
inline double mean_loss(const Tensor& losses) {
  double sum = 0;
  for (int64_t i = 0; i < losses.numel(); ++i) sum += losses.data<float>()[i];
  return sum / static_cast<double>(losses.numel());
}

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills tokens and targets (B,T) i32 with rows [slice·B, (slice+1)·B) of global batch `index`
  // (B·slices rows) of the train or validation split.
  virtual void batch(int64_t index, uint64_t seed, bool validation, int64_t slice, int64_t slices,
                     const Tensor& tokens, const Tensor& targets) = 0;
  virtual int32_t max_token() const = 0;
  virtual std::string describe() const = 0;
  // The train split's iterator position, stored in checkpoints (empty for stateless sources).
  virtual nlohmann::json state() const { return nlohmann::json::object(); }
  virtual void restore(const nlohmann::json& state) { (void)state; }
  // Seconds callers have waited for train batches so far (a streaming source's stall time).
  virtual double wait_seconds() const { return 0; }
};

}  // namespace paraflow::train
