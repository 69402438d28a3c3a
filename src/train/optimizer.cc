#include "train/optimizer.h"

#include <cmath>

namespace paraflow::train {

AdamW::AdamW(const AdamWConfig& config, const model::ParameterSet& parameters, Backend& backend)
    : config_(config), backend_(backend), m_(parameters.specs(), backend), v_(parameters.specs(), backend) {}

double AdamW::step(model::ParameterSet& parameters, model::ParameterSet& gradients, double lr) {
  float* grads = gradients.flat().data<float>();
  double norm = std::sqrt(backend_.sum_squares(grads, gradients.numel()));
  if (config_.grad_clip > 0 && norm > config_.grad_clip) {
    backend_.scale(grads, static_cast<float>(config_.grad_clip / (norm + 1e-6)), gradients.numel());
  }
  ++steps_taken_;
  for (size_t i = 0; i < parameters.specs().size(); ++i) {
    const model::TensorSpec& spec = parameters.specs()[i];
    AdamWParams params{static_cast<float>(lr), static_cast<float>(config_.beta1), static_cast<float>(config_.beta2),
                       static_cast<float>(config_.eps), spec.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f,
                       steps_taken_};
    backend_.adamw_update(parameters.at(i).data<float>(), gradients.at(i).data<float>(), m_.at(i).data<float>(),
                          v_.at(i).data<float>(), spec.shape.numel(), params);
  }
  return norm;
}

}  // namespace paraflow::train
