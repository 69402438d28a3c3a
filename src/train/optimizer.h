// AdamW over the flat parameter buffer: decoupled weight decay on the tensors whose spec asks
// for it, global-norm gradient clipping. The optimizer owns elements [begin, end) of the buffer
// — all of it, or this rank's shard under ZeRO-1 — and holds its two moments for that range
// only, as flat tensors (checkpoints store them by tensor name through the specs' offsets).
#pragma once

#include "model/parameters.h"

namespace paraflow::train {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // max global L2 norm; 0 disables clipping
};

// The factor that clips a gradient of global L2 norm `norm` to `grad_clip` (1 when under it, or
// when grad_clip is 0).
double clip_factor(double grad_clip, double norm);

class AdamW {
 public:
  // The whole buffer.
  AdamW(const AdamWConfig& config, const model::ParameterSet& parameters, Backend& backend);
  // Elements [begin, end) of it.
  AdamW(const AdamWConfig& config, const model::ParameterSet& parameters, Backend& backend, int64_t begin,
        int64_t end);

  // The factor that clips a gradient of global norm `norm` (1 when under the limit).
  double clip_factor(double norm) const;
  // Updates parameters[begin, end) from grads[begin, end) (both whole flat buffers) multiplied by
  // `grad_scale` (the clip factor; the buffer itself is left as it is), and writes the updated
  // values into half_copy[begin, end) too when it is defined (the 16-bit weights).
  void update(const Tensor& parameters, const Tensor& grads, const Tensor& half_copy, double lr, float grad_scale);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  const Tensor& first_moment() const { return m_; }   // elements [begin, end)
  const Tensor& second_moment() const { return v_; }

 private:
  AdamWConfig config_;
  Backend& backend_;
  std::vector<model::TensorSpec> specs_;
  std::vector<int64_t> offsets_;
  int64_t begin_, end_;
  Tensor m_, v_;
  int64_t steps_taken_ = 0;
};

}  // namespace paraflow::train
