// KV-cache generation against full recomputation and against transformers' generate, also for
// models with GPT2Config's attention options.
#include <gtest/gtest.h>

#include "backend/opaque_backend.h"
#include "base/file_io.h"
#include "graph/executor.h"
#include "infer/generator.h"
#include "model/gpt_graph.h"
#include "model/model_files.h"
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

std::string comma_separated(const std::vector<int32_t>& tokens) {
  std::string text;
  for (int32_t token : tokens) {
    if (!text.empty()) text += ',';
    text += std::to_string(token);
  }
  return text;
}

std::vector<double> read_f64(const std::filesystem::path& file, const std::string& name) {
  Tensor tensor = model::SafetensorsFile::load(file.string()).tensor(name);
  return std::vector<double>(tensor.data<double>(), tensor.data<double>() + tensor.numel());
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

TEST_F(GeneratorTest, OpaqueMemoryBackendSamplesTheSameTokensAsTheCpu) {
  // The generator reaches the opaque backend's memory only through its copies: the same kernels
  // on the same weights give the same logits bit for bit, hence the same sampled tokens.
  Backend& opaque = testing::opaque_backend();
  model::ParameterSet parameters(model::gpt_tensor_specs(config), opaque);
  opaque.upload(trainer->parameters().flat().raw(), parameters.flat());
  infer::Generator on_cpu(config, trainer->parameters(), cpu_backend()), on_opaque(config, parameters, opaque);
  const std::vector<int32_t> prompt{5, 17, 2};
  infer::Sampler cpu_sampler({0.9, 0, 1.0, 11}), opaque_sampler({0.9, 0, 1.0, 11});
  std::vector<int32_t> expected = on_cpu.generate(prompt, 30, cpu_sampler).tokens;
  EXPECT_EQ(on_opaque.generate(prompt, 30, opaque_sampler).tokens, expected);
  EXPECT_EQ(on_opaque.prefill(prompt), on_cpu.prefill(prompt));
}

// 16-bit weights against float32 on float32's greedy sequence. bf16: weights and activations
// rounded to bf16 once each on the way to the logits, as in training's mixed_bfloat16
// (tests/train/precision_test.cc): bound 4 eps, norm-wise. float16: the weights rounded once
// (2^-11), each matmul's inputs once, and half sums of 64 products per lane
// (cpu::kHalfPairsPerSum), whose roundings add like a random walk (sqrt(64) of 2^-11 each): bound
// 4 x (2 + sqrt(64)) x 2^-11, 0.63 of bf16's.
TEST_F(GeneratorTest, HalfWeightsAgreeWithFloat32WhereTheLogitGapExceedsTheirError) {
  std::vector<DType> dtypes{DType::f16};
  if (cpu_backend().supports(KernelOp::matmul_forward, DType::bf16)) dtypes.push_back(DType::bf16);
  for (DType weights : dtypes) {
    SCOPED_TRACE(dtype_name(weights));
    infer::Generator f32(config, trainer->parameters(), cpu_backend());
    infer::Generator half(config, trainer->parameters(), cpu_backend(), weights);
    const std::vector<int32_t> prompt{3, 24, 38, 1, 10};
    // Both read the same sequence (float32's greedy continuation); logits compared at every step.
    std::vector<std::vector<float>> ours{half.prefill(prompt)}, reference{f32.prefill(prompt)};
    for (int step = 0; step < 25; ++step) {
      const auto& last = reference.back();
      const auto token = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      reference.push_back(f32.decode(token));
      ours.push_back(half.decode(token));
    }
    std::vector<double> all_ours, all_reference;
    double max_error = 0;
    for (size_t step = 0; step < ours.size(); ++step) {
      for (size_t v = 0; v < ours[step].size(); ++v) {
        all_ours.push_back(ours[step][v]);
        all_reference.push_back(reference[step][v]);
        max_error = std::max(max_error, std::abs(static_cast<double>(ours[step][v]) - reference[step][v]));
      }
    }
    const double bound = weights == DType::bf16 ? 4 * 0x1.0p-7 : 4 * (2 + std::sqrt(64.0)) * 0x1.0p-11;
    const double error = testing::relative_error(all_ours, all_reference);
    std::printf("  %s vs f32 logits: rel err %.3e (bound %.3e), max abs error %.3e\n", dtype_name(weights), error, bound,
                max_error);
    EXPECT_LE(error, bound);
    // Where float32's top two logits are further apart than twice the largest error, the 16-bit
    // weights pick the same.
    int compared = 0;
    for (size_t step = 0; step < ours.size(); ++step) {
      std::vector<float> sorted = reference[step];
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] <= 2 * max_error) continue;
      const auto argmax = [](const std::vector<float>& logits) { return std::max_element(logits.begin(), logits.end()); };
      EXPECT_EQ(argmax(ours[step]) - ours[step].begin(), argmax(reference[step]) - reference[step].begin()) << step;
      ++compared;
    }
    std::printf("  greedy tokens compared at %d of %zu steps (the others are near-ties)\n", compared, ours.size());
    EXPECT_GE(compared, 10);
  }
}

// q8_0 weights against float32 on float32's greedy sequence, on a model whose widths are whole
// blocks (random weights). Every matmul rounds its weight and its input rows to steps of their
// block's largest magnitude / 127: at most half a step each, so a block's error is at most
// sqrt(32) / 254 of its norm, per operand; the logits' norm-wise error stays below that bound,
// 2 x 0.022 (the worst case of both operands, which the errors of the layers, averaging out, do
// not add up to).
// GPT-2 and a Llama-family model (Qwen2).
TEST(GeneratorWideModel, Q8_0LogitsWithinTheirBoundOfFloat32) {
  for (const model::GptConfig& config :
       {testing::gpt_config(97, 64, 64, 2, 2), testing::llama_config("qwen2", 97, 64, 64, 96, 2, 4, 2, 16)}) {
    SCOPED_TRACE(config.is_llama() ? "qwen2" : "gpt2");
    model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
    Rng rng(testing::test_seed());
    model::initialize_gpt(parameters, config, rng.next_u64());
    infer::Generator f32(config, parameters, cpu_backend());
    infer::Generator q8_0(config, parameters, cpu_backend(), DType::q8_0);
    const std::vector<int32_t> prompt{3, 24, 38, 1, 10};
    std::vector<double> ours, reference;
    auto append = [](std::vector<double>& all, const std::vector<float>& logits) { all.insert(all.end(), logits.begin(), logits.end()); };
    std::vector<float> last = f32.prefill(prompt);
    append(reference, last);
    append(ours, q8_0.prefill(prompt));
    for (int step = 0; step < 25; ++step) {
      const auto token = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      last = f32.decode(token);
      append(reference, last);
      append(ours, q8_0.decode(token));
    }
    const double error = testing::relative_error(ours, reference), bound = 2 * std::sqrt(32.0) / 254;
    std::printf("  q8_0 vs f32 logits: rel err %.3e (bound %.3e)\n", error, bound);
    EXPECT_LE(error, bound);
    EXPECT_GT(error, 0);  // the weights were quantized at all
  }
}

// transformers' float64 negative log-likelihoods of each window's next tokens (its log-softmax)
// for a random GPT-2 it saves in `dir`/hf: one list per window of `context` tokens, the last shorter.
std::vector<std::vector<double>> transformers_window_nlls(const testing::TempDir& dir, const std::vector<int32_t>& tokens,
                                                          size_t context) {
  const std::string config =
      R"({"vocab_size": 61, "n_positions": 32, "n_embd": 64, "n_layer": 2, "n_head": 2, "initializer_range": 0.2})";
  std::vector<std::vector<double>> windows;
  for (size_t begin = 0; begin < tokens.size(); begin += context) {
    const std::vector<int32_t> window(tokens.begin() + begin, tokens.begin() + std::min(tokens.size(), begin + context));
    const std::string out = (dir.path() / fmt::format("logits{}.safetensors", begin)).string();
    EXPECT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("save --kind lmhead --config '{}' --seed 3 --dir {} --tokens {} --out {}",
                                                              config, (dir.path() / "hf").string(), comma_separated(window), out)));
    const std::vector<double> logits = read_f64(out, "logits");
    windows.emplace_back();
    for (size_t t = 0; t + 1 < window.size(); ++t) {
      const double* row = logits.data() + t * 61;
      const double largest = *std::max_element(row, row + 61);
      double sum = 0;
      for (int v = 0; v < 61; ++v) sum += std::exp(row[v] - largest);
      windows.back().push_back(-(row[window[t + 1]] - largest - std::log(sum)));
    }
  }
  return windows;
}

void expect_perplexity(const infer::Perplexity& ours, const std::vector<double>& expected_nll, int64_t windows) {
  double mean = 0;
  for (double nll : expected_nll) mean += nll / static_cast<double>(expected_nll.size());
  EXPECT_EQ(ours.windows, windows);
  EXPECT_EQ(ours.scored, static_cast<int64_t>(expected_nll.size()));
  EXPECT_NEAR(ours.mean_nll, mean, 1e-5 * mean);
  EXPECT_NEAR(ours.perplexity, std::exp(mean), 1e-5 * std::exp(mean));
  std::printf("  perplexity %.5f, transformers %.5f\n", ours.perplexity, std::exp(mean));
}

const std::vector<int32_t> kText{5, 17, 0, 42, 42, 8, 60, 3, 11, 9, 33, 1, 59, 20, 7, 7, 45, 12, 30};

// A text's perplexity (paraflow eval --model --text) from transformers' float64 logits of the same
// saved model: each window's log-likelihoods are its log-softmax at the next token, and the
// perplexity exp of their negated mean over two windows and a shorter last one.
TEST(Perplexity, EqualsTransformersLogSoftmaxOverItsWindows) {
  testing::TempDir dir;
  std::vector<double> expected_nll;
  for (const std::vector<double>& window : transformers_window_nlls(dir, kText, 8)) {
    expected_nll.insert(expected_nll.end(), window.begin(), window.end());
  }
  model::LoadedModel loaded = model::load_model_dir(dir.path() / "hf", cpu_backend());
  infer::Generator generator(loaded.config, loaded.parameters, cpu_backend());
  expect_perplexity(infer::perplexity(generator, kText, 8), expected_nll, 3);
}

// --score-second-half, as llama-perplexity scores: whole windows only (19 tokens make two of 9,
// the last token unread), in each the predictions from position 9/2 = 4 on: tokens 5..8 of each.
TEST(Perplexity, SecondHalvesAreTheTokensLlamaPerplexityScores) {
  testing::TempDir dir;
  std::vector<double> expected_nll;
  const std::vector<std::vector<double>> windows = transformers_window_nlls(dir, {kText.begin(), kText.begin() + 18}, 9);
  for (size_t w = 0; w < 2; ++w) expected_nll.insert(expected_nll.end(), windows[w].begin() + 4, windows[w].end());
  ASSERT_EQ(expected_nll.size(), 8u);  // 9 - 1 - 9/2 = 4 a window
  model::LoadedModel loaded = model::load_model_dir(dir.path() / "hf", cpu_backend());
  infer::Generator generator(loaded.config, loaded.parameters, cpu_backend());
  expect_perplexity(infer::perplexity(generator, kText, 9, /*second_half=*/true), expected_nll, 2);
  EXPECT_THROW(infer::perplexity(generator, {kText.begin(), kText.begin() + 8}, 9, true), Error);  // no whole window
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
  ASSERT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt {} --max-new {} --out {}",
                                                            (dir.path() / "export").string(), comma_separated(prompt),
                                                            max_new,
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

struct AttentionVariant {
  const char* name;
  const char* config;   // GPT2Config arguments
  bool changes_logits;  // reorder_and_upcast_attn only changes float16/bfloat16 precision
};

class HfAttentionVariant : public ::testing::TestWithParam<AttentionVariant> {};

// transformers builds and saves a random GPT-2 with one of GPT2Config's attention options;
// paraflow loads it and must give its float64 logits and its greedy tokens, also after exporting
// the model again, which checks that transformers reads our config.json the same way.
TEST_P(HfAttentionVariant, LogitsAndGreedyTokensEqualTransformers) {
  const AttentionVariant& variant = GetParam();
  testing::TempDir dir;
  const std::vector<int32_t> prompt{5, 17, 0, 42, 42, 8, 60, 3, 11};
  const int64_t max_new = 20;
  // initializer_range 0.2 instead of GPT-2's 0.02: attention far from uniform, so its scale shows.
  const std::string config = fmt::format(
      R"({{"vocab_size": 61, "n_positions": 32, "n_embd": 24, "n_layer": 3, "n_head": 2, "initializer_range": 0.2, )"
      R"({}}})",
      variant.config);
  ASSERT_TRUE(testing::run_oracle(
      "gpt2_hf.py", fmt::format("save --kind lmhead --config '{}' --seed 3 --dir {} --tokens {} --out {}", config,
                                (dir.path() / "hf").string(), comma_separated(prompt),
                                (dir.path() / "logits.safetensors").string())));
  model::LoadedModel loaded = model::load_model_dir(dir.path() / "hf", cpu_backend());
  std::vector<double> expected = read_f64(dir.path() / "logits.safetensors", "logits");
  const double error = testing::relative_error(full_logits(loaded.config, loaded.parameters, prompt), expected);
  std::printf("  %s: logits rel err %.3e vs transformers (float64)\n", variant.name, error);
  EXPECT_LE(error, 1e-5);
  if (variant.changes_logits) {
    // The test can fail: the same weights with GPT-2's default attention give other logits.
    model::GptConfig gpt2_attention = loaded.config;
    gpt2_attention.scale_attn_weights = true;
    gpt2_attention.scale_attn_by_inverse_layer_idx = false;
    const double default_error =
        testing::relative_error(full_logits(gpt2_attention, loaded.parameters, prompt), expected);
    std::printf("  %s: with GPT-2's default attention instead, rel err %.3e\n", variant.name, default_error);
    EXPECT_GE(default_error, 1e-3);
  }

  // The KV-cache path too: prefill, then one position at a time, against the same logits.
  infer::Generator generator(loaded.config, loaded.parameters, cpu_backend());
  const size_t prefilled = 3;
  std::vector<float> cached = generator.prefill({prompt.begin(), prompt.begin() + prefilled});
  for (size_t t = prefilled; t < prompt.size(); ++t) {
    std::vector<float> logits = generator.decode(prompt[t]);
    cached.insert(cached.end(), logits.begin(), logits.end());
  }
  const auto first_compared = static_cast<std::ptrdiff_t>((prefilled - 1) * loaded.config.vocab_size);
  const double cached_error = testing::relative_error(std::vector<double>(cached.begin(), cached.end()),
                                                      {expected.begin() + first_compared, expected.end()});
  std::printf("  %s: KV-cache logits rel err %.3e vs transformers\n", variant.name, cached_error);
  EXPECT_LE(cached_error, 1e-5);

  infer::Sampler greedy({0.0, 0, 1.0, 0});
  const std::vector<int32_t> ours = generator.generate(prompt, max_new, greedy).tokens;
  model::save_model_dir(dir.path() / "export", loaded.config, loaded.parameters);
  for (const char* model_dir : {"hf", "export"}) {
    SCOPED_TRACE(model_dir);
    const std::filesystem::path out = dir.path() / (std::string(model_dir) + "-greedy.safetensors");
    ASSERT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt {} --max-new {} --out {}",
                                                              (dir.path() / model_dir).string(),
                                                              comma_separated(prompt), max_new, out.string())));
    Tensor tokens = model::SafetensorsFile::load(out.string()).tensor("tokens");
    const std::vector<int32_t> theirs(tokens.data<int64_t>(), tokens.data<int64_t>() + tokens.numel());
    EXPECT_EQ(ours, theirs);
    std::vector<double> gaps = read_f64(out, "gaps");
    std::printf("  %s (%s dir): %lld greedy tokens equal: %s; smallest top-1/top-2 logit gap %.3e\n", variant.name,
                model_dir, static_cast<long long>(max_new), ours == theirs ? "yes" : "no",
                *std::min_element(gaps.begin(), gaps.end()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gpt2Config, HfAttentionVariant,
    ::testing::Values(AttentionVariant{"unscaled", R"("scale_attn_weights": false)", true},
                      AttentionVariant{"inverse_layer_scaled", R"("scale_attn_by_inverse_layer_idx": true)", true},
                      AttentionVariant{"both",
                                       R"("scale_attn_weights": false, "scale_attn_by_inverse_layer_idx": true)", true},
                      AttentionVariant{"reordered_upcast", R"("reorder_and_upcast_attn": true)", false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace paraflow
