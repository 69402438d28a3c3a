// Random Llama-family weights for the decoding tests: ten times transformers' initial ones (and
// norms and biases spread around their initial 1 and 0), so that the next token is rarely a near-tie.
#pragma once

#include "backend/backend.h"
#include "model/gpt_config.h"
#include "model/parameters.h"
#include "test_util.h"

namespace paraflow::testing {

inline model::ParameterSet random_llama_parameters(const model::GptConfig& config, Rng& rng) {
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  model::initialize_gpt(parameters, config, rng.next_u64());
  for (size_t i = 0; i < parameters.specs().size(); ++i) {
    const model::TensorSpec& spec = parameters.specs()[i];
    float* values = parameters.at(i).data<float>();
    for (int64_t j = 0; j < spec.shape.numel(); ++j) {
      values[j] = spec.init == model::Init::ones ? 1.0f + static_cast<float>(rng.normal() * 0.1)
                  : spec.init == model::Init::zeros ? static_cast<float>(rng.normal() * 0.1)
                                                    : values[j] * 10;
    }
  }
  return parameters;
}

}  // namespace paraflow::testing
