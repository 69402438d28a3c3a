// The whole model against PyTorch + transformers (tests/reference/gpt2_torch.py, float64):
// logits, loss, every parameter gradient, and a 10-step AdamW loss curve, on GPT-2-shaped and
// awkward configs, and on the Llama family's (Llama with grouped k/v heads and rope scaling,
// Mistral, Qwen2 with its q/k/v biases). The oracle loads our export with the model_type's
// *ForCausalLM.from_pretrained, so this also checks the Hugging Face file layout. Each case runs on the CPU backend and on the opaque
// test backend, whose memory only its copies and kernels reach, and the GPT-2 cases on a GPU where one is present.
#include <gtest/gtest.h>

#include "backend/opaque_backend.h"
#include "base/file_io.h"
#include "graph/autodiff.h"
#include "model/gpt_graph.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "reference_runner.h"
#include "model_configs.h"
#include "test_util.h"
#include "train/optimizer.h"

namespace paraflow {
namespace {

struct Case {
  const char* name;
  model::GptConfig config;
  int64_t B, T;
  bool decay_embeddings = false;
};

std::vector<double> read_f32(const model::SafetensorsFile& file, const std::string& name) {
  return testing::to_vector(file.tensor(name));
}

void check(double error, double bound, const std::string& what) {
  std::printf("  %-40s rel err %.3e (bound %.0e)\n", what.c_str(), error, bound);
  EXPECT_LE(error, bound) << what;
}

// Logits, loss and every parameter gradient of one step, then the loss curve of `steps` AdamW
// updates, on `backend` from the weights in `initial`, against the float64 PyTorch run.
void check_against_torch(const Case& c, Backend& backend, const std::filesystem::path& initial, const Tensor& tokens,
                         const Tensor& targets, const model::SafetensorsFile& expected, int steps,
                         const train::AdamWConfig& adamw, double lr) {
  const int64_t B = c.B, T = c.T;
  model::ParameterSet parameters(model::gpt_tensor_specs(c.config, c.decay_embeddings), backend);
  model::load_parameters(initial, parameters);
  model::GptGraph g = model::build_gpt_training_graph(c.config, B, T);
  graph::add_backward_pass(g.graph, g.losses);
  graph::Executor executor(g.graph, backend);
  model::ParameterSet gradients(model::gpt_tensor_specs(c.config), backend);
  model::bind_parameters(executor, g, parameters, &gradients);
  Tensor loss_grad = backend.empty({B, T}, DType::f32);
  executor.bind(g.graph.value(g.losses).grad, loss_grad);
  executor.keep(g.logits);
  std::vector<int32_t> token_ids(static_cast<size_t>(B * T)), target_ids(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) {
    token_ids[static_cast<size_t>(i)] = static_cast<int32_t>(tokens.data<int64_t>()[i]);
    target_ids[static_cast<size_t>(i)] = static_cast<int32_t>(targets.data<int64_t>()[i]);
  }
  backend.upload(token_ids.data(), executor.tensor(g.tokens));
  backend.upload(target_ids.data(), executor.tensor(g.targets));
  backend.upload(std::vector<float>(static_cast<size_t>(B * T), 1.0f / static_cast<float>(B * T)).data(), loss_grad);
  auto to_vector = [&](const Tensor& tensor) {
    std::vector<float> values = backend.download<float>(tensor);
    return std::vector<double>(values.begin(), values.end());
  };
  auto forward_backward = [&] {
    backend.fill_zero(gradients.flat());
    executor.forward();
    executor.backward();
    double sum = 0;
    for (double loss : to_vector(executor.tensor(g.losses))) sum += loss;
    return sum / static_cast<double>(B * T);
  };
  double loss = forward_backward();

  check(testing::relative_error(to_vector(executor.tensor(g.logits)), read_f32(expected, "logits")), 1e-5, "logits");
  check(std::abs(loss - read_f32(expected, "loss")[0]) / read_f32(expected, "loss")[0], 1e-5, "loss");
  // Gradients by Hugging Face's tensors (a fused q/k/v projection's as q_proj, k_proj, v_proj),
  // and every tensor the oracle has a gradient for is one of ours.
  double worst = 0;
  size_t compared = 0;
  for (const auto& [name, gradient] : model::hf_tensors(gradients)) {
    double error = testing::relative_error(to_vector(gradient), read_f32(expected, "grad." + name));
    EXPECT_LE(error, 1e-4) << "gradient of " << name;
    worst = std::max(worst, error);
    ++compared;
  }
  size_t oracle_gradients = 0;
  for (const auto& [name, entry] : expected.entries()) oracle_gradients += name.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(compared, oracle_gradients) << "parameter tensors compared vs the oracle's";
  check(worst, 1e-4, fmt::format("worst of {} parameter gradients", compared));

  // The AdamW curve: the loss before each of `steps` updates, from the same initial weights.
  Tensor losses_expected = expected.tensor("losses");
  train::AdamW optimizer(adamw, parameters, backend);
  double worst_curve = 0;
  for (int step = 0; step < steps; ++step) {
    double step_loss = step == 0 ? loss : forward_backward();
    double reference = losses_expected.data<double>()[step];
    worst_curve = std::max(worst_curve, std::abs(step_loss - reference) / reference);
    EXPECT_LE(std::abs(step_loss - reference) / reference, 1e-4) << "AdamW step " << step;
    optimizer.update(parameters.flat(), gradients.flat(), Tensor(), lr, 1.0f);  // no clipping
  }
  check(worst_curve, 1e-4, fmt::format("worst loss of the {}-step AdamW curve", steps));
}

class TorchReference : public ::testing::TestWithParam<Case> {};

TEST_P(TorchReference, LogitsLossGradientsAndAdamWCurve) {
  const Case& c = GetParam();
  const int64_t B = c.B, T = c.T, V = c.config.vocab_size;
  Backend& backend = cpu_backend();
  testing::TempDir dir;
  Rng rng(testing::test_seed());

  model::ParameterSet parameters(model::gpt_tensor_specs(c.config, c.decay_embeddings), backend);
  model::initialize_gpt(parameters, c.config, rng.next_u64());
  // The Llama family's biases start at zero; random ones show that the forward pass adds them.
  for (size_t i = 0; i < parameters.specs().size() && c.config.is_llama(); ++i) {
    if (!parameters.specs()[i].name.ends_with(".bias")) continue;
    float* bias = parameters.at(i).data<float>();
    for (int64_t j = 0; j < parameters.at(i).numel(); ++j) bias[j] = static_cast<float>(rng.normal() * 0.1);
  }
  model::save_model_dir(dir.path() / "model", c.config, parameters);

  Tensor tokens = Tensor::zeros({B, T}, DType::i64), targets = Tensor::zeros({B, T}, DType::i64);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data<int64_t>()[i] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(V)));
    targets.data<int64_t>()[i] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(V)));
  }
  write_file_atomic(dir.path() / "batch.safetensors",
                    model::serialize_safetensors({{"tokens", tokens}, {"targets", targets}}));
  const int steps = 10;
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  ASSERT_TRUE(testing::run_oracle(
      "gpt2_torch.py", fmt::format("--model {} --batch {} --out {} --steps {} --lr {} --beta1 {} --beta2 {} --eps {} "
                                   "--weight-decay {} --dtype float64{}",
                                   (dir.path() / "model").string(), (dir.path() / "batch.safetensors").string(),
                                   (dir.path() / "out.safetensors").string(), steps, lr, beta1, beta2, eps,
                                   weight_decay, c.decay_embeddings ? " --decay-embeddings" : "")));
  model::SafetensorsFile expected = model::SafetensorsFile::load((dir.path() / "out.safetensors").string());

  // The same run on the CPU backend, on a GPU where one is present, and on the opaque one (memory
  // the host cannot touch), from the saved initial weights. The CUDA backend has no Llama kernels
  // (RMSNorm, RoPE, SwiGLU) yet: it runs the GPT-2 cases.
  for (Backend* backend : testing::backends_with_opaque()) {
    if (backend->device().kind == DeviceKind::cuda && c.config.is_llama()) {
      std::printf(" backend %s: skipped, no Llama kernels on it\n", backend->name().c_str());
      continue;
    }
    SCOPED_TRACE(backend->name());
    std::printf(" backend %s\n", backend->name().c_str());
    check_against_torch(c, *backend, dir.path() / "model" / "model.safetensors", tokens, targets, expected, steps,
                        {beta1, beta2, eps, weight_decay, 0.0}, lr);
  }
}

using testing::gpt_config;
using testing::llama_config;

// GPT2Config's attention options, which the oracle reads from our config.json. They change the
// attention weights' gradients even where, at GPT-2's small initial weights, the logits hardly move.
model::GptConfig with_attention_scaling(model::GptConfig config, bool scale_attn_weights,
                                        bool scale_attn_by_inverse_layer_idx) {
  config.scale_attn_weights = scale_attn_weights;
  config.scale_attn_by_inverse_layer_idx = scale_attn_by_inverse_layer_idx;
  return config;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, TorchReference,
    ::testing::Values(Case{"gpt2_shaped", gpt_config(512, 64, 64, 2, 4), 2, 64},
                      Case{"embeddings_decayed", gpt_config(512, 64, 64, 2, 4), 2, 64, true},
                      Case{"awkward", gpt_config(97, 24, 30, 1, 3), 3, 13},
                      Case{"one_head", gpt_config(61, 16, 20, 2, 1), 2, 11},
                      Case{"unscaled_attention", with_attention_scaling(gpt_config(97, 24, 30, 2, 3), false, false),
                           3, 13},
                      Case{"inverse_layer_scaled", with_attention_scaling(gpt_config(61, 16, 20, 3, 2), true, true),
                           2, 11}),
    [](const auto& info) { return std::string(info.param.name); });

model::GptConfig untied(model::GptConfig config) {
  config.tie_word_embeddings = false;
  return config;
}

// Llama 3's rope: theta 500000 and llama3 scaling, with an original context short enough that
// the test's positions reach every band of the frequencies.
model::GptConfig llama3_rope(model::GptConfig config) {
  config.rope = {.theta = 500000, .scaling = RopeScaling::llama3, .factor = 8, .low_freq_factor = 1,
                 .high_freq_factor = 4, .original_max_position = 16};
  return config;
}

model::GptConfig with_biases(model::GptConfig config) {
  config.attention_bias = true;
  config.mlp_bias = true;
  config.tie_word_embeddings = true;
  config.rope = {.theta = 1000, .scaling = RopeScaling::linear, .factor = 2.5};
  return config;
}

model::GptConfig windowed(model::GptConfig config, int64_t window) {
  config.sliding_window = window;
  return config;
}

// Awkward sizes: head_dim not n_embd / n_head, widths not multiples of 8; biases get random
// values through AdamW's first steps (they start at zero).
INSTANTIATE_TEST_SUITE_P(
    Llama, TorchReference,
    ::testing::Values(Case{"gpt2_untied_head", untied(gpt_config(97, 24, 30, 2, 3)), 3, 13},
                      Case{"llama_mha", llama_config("llama", 89, 64, 32, 56, 2, 4, 4, 8), 2, 17},
                      Case{"llama3_gqa", llama3_rope(llama_config("llama", 97, 64, 30, 37, 2, 6, 2, 6)), 3, 21},
                      Case{"llama_biases_tied", with_biases(llama_config("llama", 61, 32, 20, 28, 2, 2, 1, 10)), 2, 11},
                      Case{"mistral", windowed(llama_config("mistral", 71, 64, 24, 40, 2, 4, 2, 6), 32), 2, 19},
                      Case{"qwen2", llama_config("qwen2", 83, 64, 28, 44, 2, 4, 2, 14), 2, 15, true}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace paraflow
