// Learning-rate schedule: linear warm-up to `peak`, then cosine decay to `floor` at `total` steps.
#pragma once

#include <cmath>
#include <cstdint>

namespace paraflow::train {

struct LrSchedule {
  double peak = 6e-4;
  double floor = 6e-5;
  int64_t warmup = 0;
  int64_t total = 1;

  // `step` is 0-based: the rate used for the update that makes step+1.
  double at(int64_t step) const {
    if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (total <= warmup) return peak;
    double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    progress = progress > 1.0 ? 1.0 : progress;
    return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
  }
};

}  // namespace paraflow::train
