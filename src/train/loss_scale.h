// Dynamic loss scaling for mixed_float16, with Keras' LossScaleOptimizer defaults: the loss is
// multiplied by `scale` before backward so small float16 gradients do not flush to zero; a step
// whose gradients overflow (inf/NaN) is skipped and the scale halved (floor 1); after
// `growth_interval` finite steps in a row the scale doubles.
#pragma once

#include <cmath>
#include <cstdint>

namespace paraflow::train {

struct LossScaler {
  double scale = 32768.0;  // 2^15
  int64_t growth_interval = 2000;
  int64_t finite_steps = 0;
  int64_t skipped_steps = 0;

  // Records a step's outcome; returns whether its update should be applied.
  bool update(bool gradients_finite) {
    if (!gradients_finite) {
      scale = std::max(1.0, scale / 2);
      finite_steps = 0;
      ++skipped_steps;
      return false;
    }
    if (++finite_steps == growth_interval) {
      scale *= 2;
      finite_steps = 0;
    }
    return true;
  }
};

}  // namespace paraflow::train
