// AdamW over a ParameterSet: decoupled weight decay on the tensors whose spec asks for it,
// global-norm gradient clipping, and moments held in ParameterSets of the same layout (so a
// checkpoint stores them by tensor name).
#pragma once

#include "model/parameters.h"

namespace paraflow::train {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // max global L2 norm; 0 disables clipping
};

class AdamW {
 public:
  AdamW(const AdamWConfig& config, const model::ParameterSet& parameters, Backend& backend);

  // Clips `gradients` in place to the global norm limit, then updates `parameters`.
  // Returns the gradient norm before clipping.
  double step(model::ParameterSet& parameters, model::ParameterSet& gradients, double lr);

  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  model::ParameterSet& first_moment() { return m_; }
  model::ParameterSet& second_moment() { return v_; }

 private:
  AdamWConfig config_;
  Backend& backend_;
  model::ParameterSet m_, v_;
  int64_t steps_taken_ = 0;
};

}  // namespace paraflow::train
