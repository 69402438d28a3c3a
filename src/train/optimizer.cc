#include "train/optimizer.h"

#include <algorithm>

namespace paraflow::train {

AdamW::AdamW(const AdamWConfig& config, const model::ParameterSet& parameters, Backend& backend)
    : AdamW(config, parameters, backend, 0, parameters.numel()) {}

AdamW::AdamW(const AdamWConfig& config, const model::ParameterSet& parameters, Backend& backend, int64_t begin,
             int64_t end)
    : config_(config),
      backend_(backend),
      specs_(parameters.specs()),
      begin_(begin),
      end_(std::max(begin, end)),
      m_(backend.empty(Shape{std::max<int64_t>(end_ - begin_, 1)}, DType::f32)),
      v_(backend.empty(Shape{std::max<int64_t>(end_ - begin_, 1)}, DType::f32)) {
  for (size_t i = 0; i < specs_.size(); ++i) offsets_.push_back(parameters.offset_of(i));
}

double clip_factor(double grad_clip, double norm) {
  return grad_clip > 0 && norm > grad_clip ? grad_clip / (norm + 1e-6) : 1.0;
}

double AdamW::clip_factor(double norm) const { return train::clip_factor(config_.grad_clip, norm); }

void AdamW::update(const Tensor& parameters, const Tensor& grads, const Tensor& half_copy, double lr,
                   float grad_scale) {
  ++steps_taken_;
  for (size_t i = 0; i < specs_.size(); ++i) {
    // The part of tensor i inside [begin, end).
    const int64_t first = std::max(offsets_[i], begin_);
    const int64_t last = std::min(offsets_[i] + specs_[i].shape.numel(), end_);
    if (first >= last) continue;
    AdamWParams params{static_cast<float>(lr), static_cast<float>(config_.beta1), static_cast<float>(config_.beta2),
                       static_cast<float>(config_.eps),
                       specs_[i].weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f, steps_taken_,
                       grad_scale};
    backend_.launch(AdamWUpdate{.param = parameters.slice_flat(first, last - first),
                                .grad = grads.slice_flat(first, last - first),
                                .m = m_.slice_flat(first - begin_, last - first),
                                .v = v_.slice_flat(first - begin_, last - first),
                                .param_copy = half_copy.defined() ? half_copy.slice_flat(first, last - first) : Tensor(),
                                .params = params});
  }
}

}  // namespace paraflow::train
