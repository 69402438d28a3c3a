// Mixed precision: the cast op's rounding, the logits of a 16-bit model against float32 within
// a bound from the format's epsilon, the loss scaler skipping an overflowing step, training
// under each policy landing within 2% of float32, and the planned activation memory shrinking;
// for GPT-2 and for the Llama family (RMSNorm, rotary embeddings and SwiGLU in 16 bits).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "graph/executor.h"
#include "reference_runner.h"
#include "train/memory_report.h"
#include "train/training_graph.h"
#include "test_util.h"
#include "trained_model.h"

namespace paraflow {
namespace {

using graph::PrecisionPolicy;

TEST(Cast, RoundsToNearestEvenAndOverflowsToInfinity) {
  Backend& backend = cpu_backend();
  // 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7 and rounds to the even one (1); 1 + 3·2^-8
  // lies halfway between 1 + 2^-7 and 1 + 2^-6 and rounds to the even one (1 + 2^-6 = 0x3F82).
  std::vector<float> in{1.0f, 1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f, -2.5f, 70000.0f};
  Tensor in_t = backend.upload(in, {5}, DType::f32);
  Tensor bf16_t = backend.empty({5}, DType::bf16), f16_t = backend.empty({5}, DType::f16);
  backend.launch(Cast{.src = in_t, .dst = bf16_t});
  backend.launch(Cast{.src = in_t, .dst = f16_t});
  std::vector<uint16_t> bf16 = backend.download<uint16_t>(bf16_t), f16 = backend.download<uint16_t>(f16_t);
  EXPECT_EQ(bf16[0], 0x3F80);
  EXPECT_EQ(bf16[1], 0x3F80);  // tie -> even
  EXPECT_EQ(bf16[2], 0x3F82);  // tie -> even (up)
  EXPECT_EQ(bf16[3], 0xC020);
  EXPECT_EQ(f16[0], 0x3C00);
  EXPECT_EQ(f16[3], 0xC100);
  EXPECT_EQ(f16[4], 0x7C00);  // beyond 65504: +inf
  Tensor back_t = backend.upload(std::vector<float>(5, 1.0f), {5}, DType::f32);
  backend.launch(Cast{.src = bf16_t, .dst = back_t, .accumulate = true});
  std::vector<float> back = backend.download<float>(back_t);
  EXPECT_EQ(back[0], 2.0f);
  EXPECT_EQ(back[3], -1.5f);
}

std::vector<double> logits(PrecisionPolicy policy, const model::ParameterSet& parameters,
                           const model::GptConfig& config, const std::vector<int32_t>& tokens) {
  model::GptGraph g = train::build_training_graph(config, 1, static_cast<int64_t>(tokens.size()), "none", policy,
                                                        cpu_backend());
  graph::Executor executor(g.graph, cpu_backend());
  model::ParameterSet half = model::make_half_parameters(g, parameters, cpu_backend(), graph::storage_dtype(policy));
  model::bind_parameters(executor, g, parameters, nullptr, &half);
  executor.keep(g.logits);
  std::copy(tokens.begin(), tokens.end(), executor.tensor(g.tokens).data<int32_t>());
  executor.forward();
  return testing::to_vector(executor.tensor(g.logits));
}

class MixedPrecision : public ::testing::TestWithParam<model::GptConfig> {};

TEST_P(MixedPrecision, LogitsAgreeWithFloat32WithinTheFormatsEpsilon) {
  const model::GptConfig& config = GetParam();
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  Rng rng(testing::test_seed());
  model::initialize_gpt(parameters, config, rng.next_u64());
  std::vector<int32_t> tokens(20);
  for (auto& token : tokens) token = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
  std::vector<double> reference = logits(PrecisionPolicy::float32, parameters, config, tokens);
  // Every stored value is rounded once (relative error <= u = eps/2). About 50 roundings lie on
  // the way to the logits (2 layers, parameters and ~10 activations each; a Llama block's ~12);
  // independent rounding errors add up like sqrt(50)·u ~ 3.5 eps in norm: bound 4 eps.
  for (auto [policy, epsilon] : {std::pair{PrecisionPolicy::mixed_bfloat16, 0x1.0p-7},
                                 std::pair{PrecisionPolicy::mixed_float16, 0x1.0p-10}}) {
    double error = testing::relative_error(logits(policy, parameters, config, tokens), reference);
    std::printf("  %-15s logits rel err %.3e (bound %.3e)\n", graph::precision_policy_name(policy), error, 4 * epsilon);
    EXPECT_LE(error, 4 * epsilon);
    EXPECT_GT(error, 0.0) << "the 16-bit path must actually round";
  }
}

// The Llama family's own ops read and write 16-bit activations (no f32 copies around them).
TEST(MixedPrecisionLlama, NormsRotationsAndGatesRunIn16Bits) {
  for (PrecisionPolicy policy : {PrecisionPolicy::mixed_bfloat16, PrecisionPolicy::mixed_float16}) {
    model::GptGraph g =
        train::build_training_graph(testing::small_llama_config(), 2, 16, "none", policy, cpu_backend());
    int checked = 0;
    for (const graph::Node& node : g.graph.nodes()) {
      if (node.is_backward || (node.kind != graph::OpKind::rmsnorm && node.kind != graph::OpKind::rope &&
                               node.kind != graph::OpKind::swiglu)) {
        continue;
      }
      EXPECT_EQ(g.graph.value(node.outputs[0]).dtype, graph::storage_dtype(policy)) << node.name;
      for (size_t i = 0; i < (node.kind == graph::OpKind::swiglu ? 2u : 1u); ++i) {
        EXPECT_EQ(g.graph.value(node.inputs[i]).dtype, graph::storage_dtype(policy)) << node.name << " input " << i;
      }
      ++checked;
    }
    EXPECT_EQ(checked, 2 * 4 + 1) << "2 blocks of 2 rmsnorms, a rope and a swiglu, and the final norm";
  }
}

TEST(LossScaling, OverflowSkipsTheStepAndHalvesTheScale) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(dir.path(), 5);
  train_config.precision = PrecisionPolicy::mixed_float16;
  train_config.initial_loss_scale = 1e30;  // any float16 gradient overflows
  train::Trainer trainer(config, train_config, data, cpu_backend());
  trainer.initialize_or_resume();
  const float* flat = trainer.parameters().flat().data<float>();
  std::vector<float> before(flat, flat + trainer.parameters().numel());
  train::StepStats stats = trainer.step();
  EXPECT_TRUE(stats.skipped);
  EXPECT_EQ(trainer.loss_scaler().scale, 5e29);
  EXPECT_EQ(trainer.loss_scaler().skipped_steps, 1);
  EXPECT_EQ(std::memcmp(before.data(), flat, before.size() * sizeof(float)), 0) << "a skipped step changes nothing";
  // With Keras' initial scale 2^15 this model's gradients are finite and the step applies.
  train_config.initial_loss_scale = 32768;
  train::Trainer normal(config, train_config, data, cpu_backend());
  normal.initialize_or_resume();
  EXPECT_FALSE(normal.step().skipped);
  EXPECT_EQ(normal.loss_scaler().scale, 32768);
}

// Without a loss scale (float32, mixed_bfloat16) non-finite gradients stop the run before the
// update: an infinite final-layernorm bias makes the loss and every gradient NaN.
TEST(LossScaling, NonFiniteGradientsStopAnUnscaledRunBeforeTheUpdate) {
  for (PrecisionPolicy precision : {PrecisionPolicy::float32, PrecisionPolicy::mixed_bfloat16}) {
    testing::TempDir dir;
    model::GptConfig config = testing::small_config();
    train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
    train::TrainConfig train_config = testing::short_training(dir.path(), 5);
    train_config.precision = precision;
    train::Trainer trainer(config, train_config, data, cpu_backend());
    trainer.initialize_or_resume();
    trainer.step();
    trainer.parameters().get("ln_f.bias").device_data<float>()[0] = std::numeric_limits<float>::infinity();
    const float* flat = trainer.parameters().flat().data<float>();
    std::vector<float> before(flat, flat + trainer.parameters().numel());
    try {
      trainer.step();
      ADD_FAILURE() << precision_policy_name(precision) << ": a step with NaN gradients was applied";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step 1: the gradients are not finite"), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(before.data(), flat, before.size() * sizeof(float)), 0) << precision_policy_name(precision);
  }
}

TEST_P(MixedPrecision, EveryPolicyTrainsWithinTwoPercentOfFloat32) {
  testing::TempDir dir;
  const model::GptConfig& config = GetParam();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  std::map<std::string, double> final_loss;
  for (PrecisionPolicy policy :
       {PrecisionPolicy::float32, PrecisionPolicy::mixed_bfloat16, PrecisionPolicy::mixed_float16}) {
    train::TrainConfig train_config = testing::short_training(dir.path() / graph::precision_policy_name(policy), 300);
    train_config.precision = policy;
    train::Trainer trainer(config, train_config, data, cpu_backend());
    trainer.initialize_or_resume();
    double sum = 0;
    for (int step = 0; step < 300; ++step) {
      double loss = trainer.step().loss;
      if (step >= 280) sum += loss;
    }
    final_loss[graph::precision_policy_name(policy)] = sum / 20;
    std::printf("  %-15s mean loss of the last 20 of 300 steps: %.4f\n", graph::precision_policy_name(policy), sum / 20);
  }
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    EXPECT_NEAR(final_loss[policy], final_loss["float32"], 0.02 * final_loss["float32"]) << policy;
  }
}

// GPT-2 (2 heads of 16), and a Llama with grouped k/v heads (6 q heads of 6, 2 k/v heads).
INSTANTIATE_TEST_SUITE_P(Models, MixedPrecision,
                         ::testing::Values(testing::gpt_config(67, 48, 32, 2, 2), testing::small_llama_config()),
                         [](const auto& info) { return info.param.is_llama() ? "llama" : "gpt2"; });

TEST(MixedPrecisionMemory, SixteenBitStorageShrinksPlannedActivations) {
  model::GptConfig gpt_small = testing::gpt_config(8192, 256, 384, 6, 6);
  train::TrainConfig config;
  config.batch_size = 8;
  config.sequence_length = 256;
  int64_t f32 = train::estimate_training_memory(gpt_small, config, 1, 2).activations;
  config.precision = PrecisionPolicy::mixed_bfloat16;
  int64_t bf16 = train::estimate_training_memory(gpt_small, config, 1, 2).activations;
  std::printf("  planned activations: float32 %.1f MiB, mixed_bfloat16 %.1f MiB\n", f32 / 1048576.0, bf16 / 1048576.0);
  EXPECT_LT(bf16, f32);
}

}  // namespace
}  // namespace paraflow
