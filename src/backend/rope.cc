#include <cmath>
#include <numbers>

#include "backend/kernel_args.h"

namespace paraflow {

// transformers 4.49's _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters
// and _compute_llama3_parameters, in float32 as their torch tensors are.
std::vector<float> rope_inverse_frequencies(const RopeFrequencies& f, int64_t head_size) {
  const float base = static_cast<float>(f.theta), factor = static_cast<float>(f.factor);
  const float old_context = static_cast<float>(f.original_max_position);
  const float low = static_cast<float>(f.low_freq_factor), high = static_cast<float>(f.high_freq_factor);
  const float low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  std::vector<float> inverse(static_cast<size_t>(head_size / 2));
  for (int64_t i = 0; i < head_size / 2; ++i) {
    float value = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_size));
    if (f.scaling == RopeScaling::linear) value /= factor;
    if (f.scaling == RopeScaling::llama3) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / value;
      const float scaled = wavelen > low_freq_wavelen ? value / factor : value;
      if (wavelen < high_freq_wavelen || wavelen > low_freq_wavelen) {
        value = scaled;
      } else {  // medium frequencies: between the two
        const float smooth = (old_context / wavelen - low) / (high - low);
        value = (1 - smooth) * scaled / factor + smooth * scaled;
      }
    }
    inverse[static_cast<size_t>(i)] = value;
  }
  return inverse;
}

}  // namespace paraflow
