// KV-cache generation against full recomputation and against transformers' generate.
#include <gtest/gtest.h>

#include "base/file_io.h"
#include "graph/executor.h"
#include "infer/generator.h"
#include "model/gpt_graph.h"
#include "model/safetensors.h"
#include "reference_runner.h"
#include "test_util.h"
#include "trained_model.h"

namespace paraflow {
namespace {

// Logits of every position of `tokens`, recomputed from scratch with the training graph.
std::vector<double> full_logits(const model::GptConfig& config, const model::ParameterSet& parameters,
                                const std::vector<int32_t>& tokens) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  model::GptGraph g = model::build_gpt_training_graph(config, 1, T);
  graph::Executor executor(g.graph, cpu_backend());
  model::bind_parameters(executor, g, parameters, nullptr);
  executor.keep(g.logits);
  std::copy(tokens.begin(), tokens.end(), executor.tensor(g.tokens).data<int32_t>());
  executor.forward();
  return testing::to_vector(executor.tensor(g.logits));
}

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trainer = std::make_unique<train::Trainer>(config, testing::short_training(dir.path() / "run", 40), data, cpu_backend());
    trainer->initialize_or_resume();
    for (int i = 0; i < 40; ++i) trainer->step();
  }
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  std::unique_ptr<train::Trainer> trainer;
};

TEST_F(GeneratorTest, KvCacheLogitsEqualFullRecomputation) {
  Rng rng(testing::test_seed());
  std::vector<int32_t> tokens(30);
  for (auto& token : tokens) token = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
  std::vector<double> reference = full_logits(config, trainer->parameters(), tokens);

  infer::Generator generator(config, trainer->parameters(), cpu_backend());
  const size_t prompt = 7;
  std::vector<double> cached;
  // Prefill returns only the last prompt position; compare that one and every decoded one.
  std::vector<float> logits = generator.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + prompt));
  cached.insert(cached.end(), logits.begin(), logits.end());
  for (size_t t = prompt; t < tokens.size(); ++t) {
    logits = generator.decode(tokens[t]);
    cached.insert(cached.end(), logits.begin(), logits.end());
  }
  std::vector<double> expected(reference.begin() + static_cast<std::ptrdiff_t>((prompt - 1) * config.vocab_size), reference.end());
  double error = testing::relative_error(cached, expected);
  std::printf("  KV-cache vs full recomputation: rel err %.3e over %zu positions\n", error, tokens.size() - prompt + 1);
  EXPECT_LE(error, testing::f32_tolerance(config.n_embd * config.n_layer));
}

TEST_F(GeneratorTest, GreedyTokensAgreeWithRecomputationAndTransformers) {
  std::vector<int32_t> prompt{3, 24, 38, 1, 10};
  const int64_t max_new = 25;
  infer::Generator generator(config, trainer->parameters(), cpu_backend());
  infer::Sampler greedy({0.0, 0, 1.0, 0});
  std::vector<int32_t> ours = generator.generate(prompt, max_new, greedy).tokens;
  ASSERT_EQ(static_cast<int64_t>(ours.size()), max_new);

  // Full recomputation, step by step, also measuring the logit error the gap is compared with.
  std::vector<int32_t> sequence = prompt;
  for (int64_t step = 0; step < max_new; ++step) {
    std::vector<double> logits = full_logits(config, trainer->parameters(), sequence);
    auto last = logits.end() - config.vocab_size;
    int32_t argmax = static_cast<int32_t>(std::max_element(last, logits.end()) - last);
    EXPECT_EQ(argmax, ours[static_cast<size_t>(step)]) << "step " << step;
    sequence.push_back(argmax);
  }

  trainer->export_model(dir.path() / "export");
  std::string prompt_text;
  for (int32_t token : prompt) prompt_text += (prompt_text.empty() ? "" : ",") + std::to_string(token);
  ASSERT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt {} --max-new {} --out {}",
                                                            (dir.path() / "export").string(), prompt_text, max_new,
                                                            (dir.path() / "greedy.safetensors").string())));
  model::SafetensorsFile theirs = model::SafetensorsFile::load((dir.path() / "greedy.safetensors").string());
  Tensor tokens = theirs.tensor("tokens"), gaps = theirs.tensor("gaps");
  const double logit_error = 1e-4;  // an upper bound of the logits' absolute error vs float64 (see torch test)
  int compared = 0;
  for (int64_t step = 0; step < max_new; ++step) {
    if (gaps.data<double>()[step] <= 10 * logit_error) break;  // a near tie: sequences may diverge from here
    EXPECT_EQ(ours[static_cast<size_t>(step)], tokens.data<int64_t>()[step]) << "step " << step;
    ++compared;
  }
  std::printf("  greedy tokens equal transformers' for %d of %lld steps (stopping at the first near-tie)\n", compared,
              static_cast<long long>(max_new));
  EXPECT_GE(compared, 10);
}

}  // namespace
}  // namespace paraflow
