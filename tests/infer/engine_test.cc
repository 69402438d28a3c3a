// The serving engine against the single-sequence generator (itself checked against full
// recomputation and transformers in generator_test): greedy outputs equal alone, batched with
// 31 others, after preemption and with shared prefix blocks; seeded sampling reproducible;
// log-probabilities (of generated and of prompt tokens) equal to a log-softmax of the generator's
// logits; blocks never leak.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <map>

#include "backend/opaque_backend.h"
#include "infer/engine.h"
#include "reference_runner.h"
#include "test_util.h"
#include "trained_model.h"

namespace paraflow {
namespace {

using infer::Engine;
using infer::EngineOptions;
using infer::Request;

// Collects a request's events; `stop_after` makes on_token return false after that many tokens.
class RecordingSink : public infer::RequestSink {
 public:
  explicit RecordingSink(int64_t stop_after = -1) : stop_after_(stop_after) {}
  bool on_token(const infer::TokenEvent& event) override {
    events.push_back(event);
    return stop_after_ < 0 || static_cast<int64_t>(events.size()) < stop_after_;
  }
  void on_prompt_token(const infer::TokenEvent& event) override {
    EXPECT_TRUE(events.empty()) << "a prompt token after a generated one";
    prompt_events.push_back(event);
  }
  void on_finish(const infer::Outcome& outcome) override { done.set_value(outcome); }
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> ids;
    for (const auto& event : events) ids.push_back(event.token);
    return ids;
  }
  infer::Outcome wait() { return finished.get(); }

  std::vector<infer::TokenEvent> events, prompt_events;
  std::promise<infer::Outcome> done;
  std::shared_future<infer::Outcome> finished = done.get_future().share();

 private:
  int64_t stop_after_;
};

// Greedy continuations of `prompts`, submitted together to `engine`.
std::vector<std::vector<int32_t>> greedy_together(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                  int64_t max_tokens) {
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& prompt : prompts) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.submit(Request{.prompt = prompt, .max_tokens = max_tokens, .sampling = {.temperature = 0}}, sinks.back());
  }
  std::vector<std::vector<int32_t>> outputs;
  for (auto& sink : sinks) {
    sink->wait();
    outputs.push_back(sink->tokens());
  }
  return outputs;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trainer = std::make_unique<train::Trainer>(config, testing::short_training(dir.path() / "run", 40), data,
                                               cpu_backend());
    trainer->initialize_or_resume();
    for (int i = 0; i < 40; ++i) trainer->step();
  }

  std::vector<int32_t> random_prompt(Rng& rng, int64_t length) {
    std::vector<int32_t> prompt(static_cast<size_t>(length));
    for (auto& token : prompt) token = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
    return prompt;
  }

  // The single-sequence generator's continuation: the reference.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_tokens,
                                const infer::SamplingConfig& sampling = {.temperature = 0},
                                DType weights = DType::f32) {
    infer::Generator generator(config, trainer->parameters(), cpu_backend(), weights);
    infer::Sampler sampler(sampling);
    return generator.generate(prompt, max_tokens, sampler).tokens;
  }

  Request greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    return Request{.prompt = std::move(prompt), .max_tokens = max_tokens, .sampling = {.temperature = 0}};
  }

  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  std::unique_ptr<train::Trainer> trainer;
};

// References are computed before an engine starts: its thread's OpenMP team and the test
// thread's would otherwise spin against each other on two cores. In f32 and with float16 weights
// (the engine's f32 KV cache as the generator's).
TEST_F(EngineTest, GreedyOutputAloneEqualsTheGenerator) {
  for (DType weights : {DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(weights));
    Rng rng(testing::test_seed());
    std::vector<std::vector<int32_t>> prompts, expected;
    for (int64_t length : {1, 5, 16, 17, 23}) {
      prompts.push_back(random_prompt(rng, length));
      expected.push_back(generate(prompts.back(), 9, {.temperature = 0}, weights));
    }
    Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01, .weights = weights});
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto sink = std::make_shared<RecordingSink>();
      engine.submit(greedy(prompts[i], 9), sink);
      infer::Outcome outcome = sink->wait();
      EXPECT_EQ(sink->tokens(), expected[i]) << "prompt of " << prompts[i].size();
      EXPECT_EQ(outcome.reason, infer::FinishReason::length);
      EXPECT_EQ(outcome.generated_tokens, 9);
      EXPECT_EQ(outcome.prompt_tokens, static_cast<int64_t>(prompts[i].size()));
      EXPECT_TRUE(outcome.error.empty()) << outcome.error;
    }
    EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
  }
}

// Profiling times the step's ops and host work (within the wall time the requests took) and
// changes no output; off, the engine keeps no profile.
TEST_F(EngineTest, ProfileTimesAStepsOpsAndHostWorkOnlyWhenAsked) {
  Rng rng(testing::test_seed());
  const std::vector<int32_t> prompt = random_prompt(rng, 7);
  const std::vector<int32_t> expected = generate(prompt, 6);
  for (bool profile : {true, false}) {
    Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01, .profile = profile});
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(greedy_together(engine, {prompt, prompt}, 6), (std::vector<std::vector<int32_t>>{expected, expected}));
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::map<std::string, double> times = engine.profile();
    if (!profile) {
      EXPECT_TRUE(times.empty());
      continue;
    }
    double total = 0;
    for (const auto& [part, seconds] : times) {
      EXPECT_GE(seconds, 0) << part;
      total += seconds;
    }
    for (const char* part : {"matmul forward", "attention_paged forward", "lm_head forward", "layernorm forward",
                             "step: scheduling", "step: sampling and streaming"}) {
      ASSERT_TRUE(times.contains(part)) << part;
      EXPECT_GT(times.at(part), 0) << part;
    }
    EXPECT_LE(total, wall);
  }
}

// On a backend whose memory the host cannot read (tests/backend/opaque_backend.h: the CPU's
// kernels), the engine copies each step's logits out before sampling, and its greedy tokens are
// the CPU backend's, bit for bit.
TEST_F(EngineTest, OpaqueMemoryBackendServesTheCpuBackendsTokens) {
  Rng rng(testing::test_seed());
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t length : {2, 9, 17}) prompts.push_back(random_prompt(rng, length));
  std::vector<std::vector<int32_t>> expected;
  {
    Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
    expected = greedy_together(engine, prompts, 7);
  }
  const model::ParameterSet opaque_parameters =
      trainer->parameters().converted_copy(testing::opaque_backend(), DType::f32, {});
  Engine engine(config, opaque_parameters, testing::opaque_backend(), EngineOptions{.kv_cache_gb = 0.01});
  EXPECT_EQ(greedy_together(engine, prompts, 7), expected);
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
}

// Logits that overflowed fail the step's requests with the sampler's message (the tokens are
// drawn on every thread: the failure must come back to the engine thread, not end the process),
// and their blocks go back to the pool.
TEST_F(EngineTest, OverflowedLogitsFailTheStepsRequestsByName) {
  model::ParameterSet broken = trainer->parameters().on_host();
  broken.write_on_host([](model::ParameterSet& parameters) {
    const Tensor& bias = parameters.get("ln_f.bias");
    std::fill_n(bias.data<float>(), bias.numel(), std::numeric_limits<float>::infinity());
  });
  Rng rng(testing::test_seed());
  Engine engine(config, broken, cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.submit(greedy(random_prompt(rng, 3 + i), 4), sinks.back());
  }
  for (auto& sink : sinks) {
    const infer::Outcome outcome = sink->wait();
    EXPECT_TRUE(sink->events.empty());
    EXPECT_TRUE(contains(outcome.error, "engine step failed")) << outcome.error;
    EXPECT_TRUE(contains(outcome.error, "overflowed")) << outcome.error;
  }
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
}

TEST_F(EngineTest, ThirtyTwoConcurrentRequestsEachEqualTheirOutputAlone) {
  Rng rng(testing::test_seed());
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 32; ++i) {
    prompts.push_back(random_prompt(rng, 1 + static_cast<int64_t>(rng.below(30))));
    expected.push_back(generate(prompts.back(), 12));
  }
  // Small chunks: long prompts are prefilled over several steps, mixed with others' decodes.
  Engine engine(config, trainer->parameters(), cpu_backend(),
                EngineOptions{.kv_cache_gb = 0.05, .max_num_seqs = 32, .max_batched_tokens = 48});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& prompt : prompts) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.submit(greedy(prompt, 12), sinks.back());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    sinks[i]->wait();
    EXPECT_EQ(sinks[i]->tokens(), expected[i]) << "request " << i;
  }
  const infer::EngineStats stats = engine.stats();
  std::printf("  32 requests in %lld steps\n", static_cast<long long>(stats.steps));
  EXPECT_LT(stats.steps, 32 * 12);  // batched: far fewer steps than tokens
  EXPECT_EQ(stats.blocks_free, stats.blocks_total);
}

// 16-bit weights (bf16 with bf16 activations, which round every difference up to a visible one;
// float16 in half arithmetic): batched decoding must give each row exactly the arithmetic it gets
// alone (row-invariant matmuls), or greedy tokens flip.
TEST_F(EngineTest, HalfWeightOutputsBatchedWithThirtyOneOthersEqualTheirOutputsAlone) {
  std::vector<DType> dtypes{DType::f16};
  if (cpu_backend().supports(KernelOp::matmul_forward, DType::bf16)) dtypes.push_back(DType::bf16);
  for (DType weights : dtypes) {
    SCOPED_TRACE(dtype_name(weights));
    Rng rng(testing::test_seed());
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 32; ++i) prompts.push_back(random_prompt(rng, 1 + static_cast<int64_t>(rng.below(30))));
    const EngineOptions options{.kv_cache_gb = 0.05, .max_num_seqs = 32, .max_batched_tokens = 48, .weights = weights};
    Engine engine(config, trainer->parameters(), cpu_backend(), options);
    auto run = [&](bool together) {
      std::vector<std::shared_ptr<RecordingSink>> sinks;
      std::vector<std::vector<int32_t>> outputs;
      for (const auto& prompt : prompts) {
        sinks.push_back(std::make_shared<RecordingSink>());
        engine.submit(greedy(prompt, 12), sinks.back());
        if (!together) sinks.back()->wait();
      }
      for (auto& sink : sinks) {
        sink->wait();
        outputs.push_back(sink->tokens());
      }
      return outputs;
    };
    const std::vector<std::vector<int32_t>> alone = run(false);
    // Alone: the prefix cache now holds every prompt; batched runs must not lean on it.
    Engine fresh(config, trainer->parameters(), cpu_backend(), options);
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (const auto& prompt : prompts) {
      sinks.push_back(std::make_shared<RecordingSink>());
      fresh.submit(greedy(prompt, 12), sinks.back());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      sinks[i]->wait();
      EXPECT_EQ(sinks[i]->tokens(), alone[i]) << "request " << i;
    }
    EXPECT_EQ(run(true), alone);  // and batched with every prompt's blocks cached
  }
}

// bf16 weights make keys and values that are bf16 values already: a bf16 KV cache holds them
// exactly, so every token and log-probability equals the f32 cache's, batched, while a block
// takes half the bytes (twice the blocks in the same memory).
TEST_F(EngineTest, Bf16KvCacheHoldsTheKeysOfBf16WeightsExactlyInTwiceTheBlocks) {
  Rng rng(testing::test_seed());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_prompt(rng, 1 + static_cast<int64_t>(rng.below(30))));
  auto run = [&](DType kv_cache) {
    Engine engine(config, trainer->parameters(), cpu_backend(),
                  EngineOptions{.kv_cache_gb = 0.02, .max_num_seqs = 8, .max_batched_tokens = 48,
                                .weights = DType::bf16, .kv_cache_dtype = kv_cache});
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (const auto& prompt : prompts) {
      sinks.push_back(std::make_shared<RecordingSink>());
      engine.submit(Request{.prompt = prompt, .max_tokens = 12, .sampling = {.temperature = 0}, .top_logprobs = 3},
                    sinks.back());
    }
    for (auto& sink : sinks) sink->wait();
    return std::pair{sinks, engine.stats().blocks_total};
  };
  const auto [f32_sinks, f32_blocks] = run(DType::f32);
  const auto [bf16_sinks, bf16_blocks] = run(DType::bf16);
  EXPECT_GE(bf16_blocks, 2 * f32_blocks);
  EXPECT_LE(bf16_blocks, 2 * f32_blocks + 1);  // each count rounded down from the same bytes
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto &expected = f32_sinks[i]->events, &events = bf16_sinks[i]->events;
    ASSERT_EQ(events.size(), expected.size()) << "request " << i;
    for (size_t t = 0; t < events.size(); ++t) {
      EXPECT_EQ(events[t].token, expected[t].token) << "request " << i << " token " << t;
      EXPECT_EQ(events[t].logprob, expected[t].logprob) << "request " << i << " token " << t;
      ASSERT_EQ(events[t].top.size(), expected[t].top.size());
      for (size_t k = 0; k < events[t].top.size(); ++k) {
        EXPECT_EQ(events[t].top[k].token, expected[t].top[k].token);
        EXPECT_EQ(events[t].top[k].logprob, expected[t].top[k].logprob);
      }
    }
  }
}

// The same with model widths that are multiples of 32: where the CPU has AMX, the serving
// matmuls run on its tiles (cpu/amx_tiles, the weights stored out_in_tiles), which must keep
// every row's arithmetic its own.
// Random weights: near-ties abound, so any row-to-row leak would show.
TEST(EngineWideModel, Bf16OutputsBatchedEqualTheirOutputsAlone) {
  if (!cpu_backend().supports(KernelOp::matmul_forward, DType::bf16)) {
    GTEST_SKIP() << "this CPU has no bf16 GEMMs (AVX512_BF16 or AMX)";
  }
  const model::GptConfig config = testing::gpt_config(97, 64, 64, 2, 2);
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  Rng rng(testing::test_seed());
  model::initialize_gpt(parameters, config, rng.next_u64());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> prompt(1 + rng.below(40));
    for (auto& token : prompt) token = static_cast<int32_t>(rng.below(97));
    prompts.push_back(prompt);
  }
  const EngineOptions options{.kv_cache_gb = 0.05, .max_num_seqs = 24, .max_batched_tokens = 64, .weights = DType::bf16};
  std::vector<std::vector<int32_t>> alone;
  {
    Engine engine(config, parameters, cpu_backend(), options);
    for (const auto& prompt : prompts) {
      auto sink = std::make_shared<RecordingSink>();
      engine.submit(Request{.prompt = prompt, .max_tokens = 16, .sampling = {.temperature = 0}}, sink);
      sink->wait();
      alone.push_back(sink->tokens());
    }
  }
  Engine engine(config, parameters, cpu_backend(), options);
  const std::vector<std::vector<int32_t>> batched = greedy_together(engine, prompts, 16);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(batched[i], alone[i]) << "request " << i;
}

// q8_0 and q4_k weights (rows quantized to int8 blocks in every matmul): served batched, each
// request's greedy tokens are the generator's alone, exactly (random weights: near-ties abound, so
// a row's arithmetic leaking into another's, or differing from the generator's, would show).
// GPT-2 and a Llama-family model (Qwen2: grouped k/v heads, q/k/v biases, a head of its own), as
// wide as the type's blocks need (q4_k: every matmul's input features a multiple of 256), and a
// Qwen2 as Qwen2.5-0.5B is, whose q4_k falls back to q5_0 but for the MLP's down projection.
TEST(EngineWideModel, QuantizedServingBatchedEqualsTheGenerator) {
  const std::pair<DType, model::GptConfig> cases[] = {
      {DType::q8_0, testing::gpt_config(97, 64, 64, 2, 2)},
      {DType::q8_0, testing::llama_config("qwen2", 97, 64, 64, 96, 2, 4, 2, 16)},
      {DType::q4_k, testing::gpt_config(97, 64, 256, 2, 2)},
      {DType::q4_k, testing::llama_config("qwen2", 97, 64, 256, 512, 2, 4, 2, 64)},
      {DType::q4_k, testing::llama_config("qwen2", 97, 64, 96, 256, 2, 4, 2, 24)}};
  for (const auto& [weights, config] : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(weights) << (config.is_llama() ? " qwen2" : " gpt2"));
    model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
    Rng rng(testing::test_seed());
    model::initialize_gpt(parameters, config, rng.next_u64());
    std::vector<std::vector<int32_t>> prompts, expected;
    for (int i = 0; i < 12; ++i) {
      std::vector<int32_t> prompt(1 + rng.below(20));
      for (auto& token : prompt) token = static_cast<int32_t>(rng.below(97));
      infer::Generator generator(config, parameters, cpu_backend(), weights);
      infer::Sampler greedy({.temperature = 0});
      expected.push_back(generator.generate(prompt, 16, greedy).tokens);
      prompts.push_back(std::move(prompt));
    }
    Engine engine(config, parameters, cpu_backend(),
                  EngineOptions{.kv_cache_gb = 0.05, .max_num_seqs = 12, .max_batched_tokens = 64, .weights = weights});
    const std::vector<std::vector<int32_t>> batched = greedy_together(engine, prompts, 16);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(batched[i], expected[i]) << "request " << i;
  }
}

// A wider model: in f32 the serving engine and the generator store every linear weight and wte
// out_in_interleaved where the CPU's kernel prefers it; both take the same kernels, so batched
// serving must give the generator's tokens exactly (random weights: near-ties abound).
TEST(EngineWideModel, Float32ServingEqualsTheGenerator) {
  const model::GptConfig config = testing::gpt_config(97, 64, 64, 2, 2);
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  Rng rng(testing::test_seed());
  model::initialize_gpt(parameters, config, rng.next_u64());
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt(1 + rng.below(4));
    for (auto& token : prompt) token = static_cast<int32_t>(rng.below(97));
    infer::Generator generator(config, parameters, cpu_backend(), DType::f32);
    infer::Sampler greedy({.temperature = 0});
    expected.push_back(generator.generate(prompt, 16, greedy).tokens);
    prompts.push_back(std::move(prompt));
  }
  Engine engine(config, parameters, cpu_backend(),
                EngineOptions{.kv_cache_gb = 0.05, .max_num_seqs = 12, .max_batched_tokens = 64});
  const std::vector<std::vector<int32_t>> served = greedy_together(engine, prompts, 16);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(served[i], expected[i]) << "request " << i;
}

// A one-layer model with a context of 160, for the token budgets' step counts.
class EngineTokenBudget : public ::testing::Test {
 protected:
  EngineTokenBudget() { model::initialize_gpt(parameters, config, rng.next_u64()); }
  const model::GptConfig config = testing::gpt_config(97, 160, 32, 1, 2);
  model::ParameterSet parameters{model::gpt_tensor_specs(config), cpu_backend()};
  Rng rng{testing::test_seed()};
};

// Without a token budget a step takes max(128, max_num_seqs) tokens: an idle engine prefills a
// prompt of 150 in ceil(150 / budget) steps, the last of which also samples the first token.
TEST_F(EngineTokenBudget, DefaultsToTheLargerOf128AndMaxNumSeqs) {
  std::vector<int32_t> prompt(150);
  for (auto& token : prompt) token = static_cast<int32_t>(rng.below(97));
  for (const auto& [max_num_seqs, steps] : {std::pair<int64_t, int64_t>{8, 2}, {100, 2}, {150, 1}}) {
    Engine engine(config, parameters, cpu_backend(), EngineOptions{.kv_cache_gb = 0.01, .max_num_seqs = max_num_seqs});
    auto sink = std::make_shared<RecordingSink>();
    engine.submit(Request{.prompt = prompt, .max_tokens = 1, .sampling = {.temperature = 0}}, sink);
    EXPECT_TRUE(sink->wait().error.empty());
    EXPECT_EQ(engine.options().max_batched_tokens, std::max<int64_t>(128, max_num_seqs));
    EXPECT_EQ(engine.options().max_decoding_step_tokens, 32);
    EXPECT_EQ(engine.stats().steps, steps) << "max_num_seqs " << max_num_seqs;
    EXPECT_EQ(engine.stats().prompt_tokens, 150);
  }
}

// Holds the engine in the step of its request's first token (on_token runs on the engine
// thread) until the test releases it: what the test submits meanwhile meets a streaming request.
class FirstTokenSink : public infer::RequestSink {
 public:
  bool on_token(const infer::TokenEvent&) override {
    if (!first_seen_) {
      first_seen_ = true;
      first.set_value();
      release.get_future().wait();
    }
    return true;
  }
  void on_finish(const infer::Outcome& outcome) override { done.set_value(outcome); }
  std::promise<void> first, release;
  std::promise<infer::Outcome> done;

 private:
  bool first_seen_ = false;  // (the engine thread's alone)
};

// A prompt that arrives while another request streams is prefilled in chunks that keep each step
// within max_decoding_step_tokens (one of them the streaming request's token): 60 prompt tokens
// at 7 a step take at least 9 steps, none over 8 tokens. With the decoding budget as large as the
// step (the control) the prompt goes in one step of 61 tokens.
TEST_F(EngineTokenBudget, StepsThatStreamKeepToTheDecodingBudget) {
  std::vector<int32_t> long_prompt(60);
  for (auto& token : long_prompt) token = static_cast<int32_t>(rng.below(97));
  for (const int64_t decoding_budget : {8, 64}) {
    Engine engine(config, parameters, cpu_backend(),
                  EngineOptions{.kv_cache_gb = 0.01, .max_num_seqs = 4, .max_batched_tokens = 64,
                                .max_decoding_step_tokens = decoding_budget});
    auto streaming = std::make_shared<FirstTokenSink>();
    std::future<void> first = streaming->first.get_future();
    const uint64_t streaming_id =
        engine.submit(Request{.prompt = {1, 2, 3, 4}, .max_tokens = 150, .sampling = {.temperature = 0}}, streaming);
    first.wait();
    Histogram& step_tokens = engine.metrics().histogram("paraflow_batch_tokens", "", {});
    const Histogram::Snapshot before = step_tokens.snapshot();
    auto prompt_sink = std::make_shared<RecordingSink>();
    engine.submit(Request{.prompt = long_prompt, .max_tokens = 1, .sampling = {.temperature = 0}}, prompt_sink);
    streaming->release.set_value();
    EXPECT_TRUE(prompt_sink->wait().error.empty());
    const Histogram::Snapshot after = step_tokens.snapshot();
    engine.cancel(streaming_id);
    const size_t up_to_8 = static_cast<size_t>(std::find(after.upper_bounds.begin(), after.upper_bounds.end(), 8.0) -
                                               after.upper_bounds.begin());
    ASSERT_LT(up_to_8, after.upper_bounds.size());
    const uint64_t steps = after.count - before.count;
    const uint64_t small_steps = after.cumulative_counts[up_to_8] - before.cumulative_counts[up_to_8];
    if (decoding_budget == 8) {
      EXPECT_GE(steps, 9u);
      EXPECT_EQ(small_steps, steps) << "a step held more than 8 tokens while a request streamed";
    } else {
      EXPECT_LT(small_steps, steps) << "the control: the prompt should have gone in one step";
    }
    streaming->done.get_future().wait();  // cancelled, or finished by then
  }
}

TEST_F(EngineTest, PreemptedSequencesRecomputeAndGiveTheSameOutput) {
  Rng rng(testing::test_seed());
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(random_prompt(rng, 20 + static_cast<int64_t>(rng.below(8))));
    expected.push_back(generate(prompts.back(), 20));
  }
  // A pool of 6 blocks (bytes per block: 2 (k, v) * layers * n_embd * 16 tokens * 4 bytes): room
  // for one full-context sequence of 48 tokens (3 blocks) and a bit, not for 8 of ~45 tokens.
  const double block_bytes = 2.0 * static_cast<double>(config.n_layer * config.n_embd) * 16 * 4;
  Engine engine(config, trainer->parameters(), cpu_backend(),
                EngineOptions{.kv_cache_gb = 6.5 * block_bytes / (1024.0 * 1024 * 1024), .max_num_seqs = 8});
  ASSERT_EQ(engine.stats().blocks_total, 6);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& prompt : prompts) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.submit(greedy(prompt, 20), sinks.back());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    infer::Outcome outcome = sinks[i]->wait();
    EXPECT_TRUE(outcome.error.empty()) << outcome.error;
    EXPECT_EQ(sinks[i]->tokens(), expected[i]) << "request " << i;
  }
  std::printf("  %lld preemptions\n", static_cast<long long>(engine.stats().preemptions));
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
  // A preempted sequence's second admission is not a second request's wait.
  EXPECT_NE(engine.metrics().render().find("paraflow_request_queue_seconds_count 8\n"), std::string::npos)
      << engine.metrics().render();
}

TEST_F(EngineTest, SharedPromptPrefixesReuseBlocksWithCopyOnWrite) {
  Rng rng(testing::test_seed());
  // 32 tokens: two full blocks. A second request matches both; it recomputes the last prompt
  // token, whose key and value go to its own copy of the second block.
  std::vector<int32_t> prompt = random_prompt(rng, 32);
  std::vector<int32_t> longer = prompt;
  for (int i = 0; i < 7; ++i) longer.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
  const std::vector<int32_t> expected = generate(prompt, 10), expected_longer = generate(longer, 8);
  Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  auto first = std::make_shared<RecordingSink>();
  engine.submit(greedy(prompt, 10), first);
  EXPECT_EQ(first->wait().cached_prompt_tokens, 0);
  EXPECT_EQ(first->tokens(), expected);
  // Two at once sharing the cached blocks, one writing into the shared second block.
  auto again = std::make_shared<RecordingSink>(), extended = std::make_shared<RecordingSink>();
  engine.submit(greedy(prompt, 10), again);
  engine.submit(greedy(longer, 8), extended);
  EXPECT_EQ(again->wait().cached_prompt_tokens, 31);
  EXPECT_EQ(extended->wait().cached_prompt_tokens, 32);
  EXPECT_EQ(again->tokens(), expected);
  EXPECT_EQ(extended->tokens(), expected_longer);
  EXPECT_EQ(engine.stats().cached_prompt_tokens, 63);
  // The first request's blocks are cached again, unchanged by the two that shared them.
  auto third = std::make_shared<RecordingSink>();
  engine.submit(greedy(prompt, 10), third);
  EXPECT_EQ(third->wait().cached_prompt_tokens, 31);
  EXPECT_EQ(third->tokens(), expected);
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleAloneAndBatched) {
  Rng rng(testing::test_seed());
  std::vector<int32_t> prompt = random_prompt(rng, 6);
  const infer::SamplingConfig sampling{.temperature = 1.3, .top_k = 20, .top_p = 0.95, .seed = 77};
  const std::vector<int32_t> expected = generate(prompt, 15, sampling);
  Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 6; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    Request request{.prompt = i % 2 ? random_prompt(rng, 9) : prompt, .max_tokens = 15, .sampling = sampling};
    request.sampling.seed = i % 2 ? 5 : 77;
    engine.submit(request, sinks.back());
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    sinks[i]->wait();
    if (i % 2 == 0) {
      EXPECT_EQ(sinks[i]->tokens(), expected) << "request " << i;
    }
  }
}

TEST_F(EngineTest, LogprobsAreTheLogSoftmaxOfTheLogits) {
  Rng rng(testing::test_seed());
  std::vector<int32_t> prompt = random_prompt(rng, 8);
  infer::Generator generator(config, trainer->parameters(), cpu_backend());
  std::vector<float> logits = generator.prefill(prompt);
  Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  auto sink = std::make_shared<RecordingSink>();
  engine.submit(Request{.prompt = prompt, .max_tokens = 1, .sampling = {.temperature = 0}, .top_logprobs = 5}, sink);
  sink->wait();
  ASSERT_EQ(sink->events.size(), 1u);
  const infer::TokenEvent& event = sink->events[0];
  double normalizer = 0;
  for (float logit : logits) normalizer += std::exp(static_cast<double>(logit));
  auto logprob = [&](int32_t token) { return static_cast<double>(logits[static_cast<size_t>(token)]) - std::log(normalizer); };
  EXPECT_NEAR(event.logprob, logprob(event.token), 1e-4);
  ASSERT_EQ(event.top.size(), 5u);
  EXPECT_EQ(event.top[0].token, event.token);  // greedy: the likeliest
  for (size_t i = 0; i < event.top.size(); ++i) {
    EXPECT_NEAR(event.top[i].logprob, logprob(event.top[i].token), 1e-4);
    if (i > 0) {
      EXPECT_GE(event.top[i - 1].logprob, event.top[i].logprob);
    }
  }
}

// Scored prompts: token i's log-probability (and alternatives) is the log-softmax of the
// generator's logits after tokens [0, i), each token once and in order, whether the prompt runs
// in several chunks (an 8-token budget), its head rows in several passes (two sequences at most,
// so at most two rows a pass), after a preemption, or after its blocks were cached by another.
TEST_F(EngineTest, PromptLogprobsAreTheLogSoftmaxOfThePrefixesLogits) {
  Rng rng(testing::test_seed());
  const std::vector<int32_t> prompt = random_prompt(rng, 21);
  infer::Generator generator(config, trainer->parameters(), cpu_backend());
  std::vector<std::vector<double>> reference;  // [i]: log-softmax after prompt[0, i)
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<float> logits = generator.prefill(std::vector<int32_t>(prompt.begin(), prompt.begin() + i));
    double normalizer = 0;
    for (float logit : logits) normalizer += std::exp(static_cast<double>(logit));
    std::vector<double> logprobs;
    for (float logit : logits) logprobs.push_back(static_cast<double>(logit) - std::log(normalizer));
    reference.push_back(std::move(logprobs));
  }
  const std::vector<int32_t> expected = generate(prompt, 3);
  auto check_scored = [&](const RecordingSink& sink, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(sink.prompt_events.size(), prompt.size() - 1);
    for (size_t i = 0; i < sink.prompt_events.size(); ++i) {
      const infer::TokenEvent& event = sink.prompt_events[i];
      const std::vector<double>& expected_logprobs = reference[i];
      EXPECT_EQ(event.token, prompt[i + 1]) << i;
      EXPECT_NEAR(event.logprob, expected_logprobs[static_cast<size_t>(event.token)], 1e-4) << i;
      ASSERT_EQ(event.top.size(), 3u);
      const double best = *std::max_element(expected_logprobs.begin(), expected_logprobs.end());
      EXPECT_NEAR(event.top[0].logprob, best, 1e-4) << i;
      for (const infer::TokenLogprob& alternative : event.top) {
        EXPECT_NEAR(alternative.logprob, expected_logprobs[static_cast<size_t>(alternative.token)], 1e-4) << i;
      }
    }
    EXPECT_EQ(sink.tokens(), expected);
  };
  const Request scored{.prompt = prompt, .max_tokens = 3, .sampling = {.temperature = 0}, .top_logprobs = 3,
                       .prompt_logprobs = true};
  {
    Engine engine(config, trainer->parameters(), cpu_backend(),
                  EngineOptions{.kv_cache_gb = 0.01, .max_num_seqs = 2, .max_batched_tokens = 8});
    auto other = std::make_shared<RecordingSink>(), first = std::make_shared<RecordingSink>();
    engine.submit(greedy(random_prompt(rng, 30), 5), other);
    engine.submit(scored, first);
    first->wait();
    check_scored(*first, "in chunks, two rows a pass");
    EXPECT_TRUE(other->prompt_events.empty());
    other->wait();
    auto again = std::make_shared<RecordingSink>();
    engine.submit(scored, again);  // its prompt's blocks are cached: it computes them anyway
    EXPECT_EQ(again->wait().cached_prompt_tokens, 0);
    check_scored(*again, "after its blocks were cached");
    EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
  }
  // Six blocks for eight sequences of ~40 tokens: preemptions (as in the test above).
  const double block_bytes = 2.0 * static_cast<double>(config.n_layer * config.n_embd) * 16 * 4;
  Engine engine(config, trainer->parameters(), cpu_backend(),
                EngineOptions{.kv_cache_gb = 6.5 * block_bytes / (1024.0 * 1024 * 1024), .max_num_seqs = 8});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    if (i % 2 == 0) {
      engine.submit(Request{.prompt = prompt, .max_tokens = 20, .sampling = {.temperature = 0}, .top_logprobs = 3,
                            .prompt_logprobs = true},
                    sinks.back());
    } else {
      engine.submit(greedy(random_prompt(rng, 25), 20), sinks.back());
    }
  }
  for (auto& sink : sinks) EXPECT_TRUE(sink->wait().error.empty());
  EXPECT_GT(engine.stats().preemptions, 0);
  const std::vector<int32_t> longer = generate(prompt, 20);
  for (int i = 0; i < 8; i += 2) {
    RecordingSink& sink = *sinks[static_cast<size_t>(i)];
    EXPECT_EQ(sink.tokens(), longer) << i;
    sink.events.resize(3);  // check_scored compares the first three
    check_scored(sink, fmt::format("request {} of 8, in a pool of 6 blocks", i));
  }
}

// A sink that fails on a prompt token ends its request with the error, in the middle of a step
// whose chunk covers whole blocks: the blocks go back to the pool (none published for it), and
// the engine goes on serving.
TEST_F(EngineTest, ASinkFailingOnAPromptTokenEndsOnlyItsRequest) {
  class FailingSink : public RecordingSink {
   public:
    void on_prompt_token(const infer::TokenEvent& event) override {
      RecordingSink::on_prompt_token(event);
      if (prompt_events.size() == 3) throw std::runtime_error("the client went away");
    }
  };
  Rng rng(testing::test_seed());
  const std::vector<int32_t> prompt = random_prompt(rng, 40), other = random_prompt(rng, 10);
  const std::vector<int32_t> expected = generate(other, 5);
  Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  auto failing = std::make_shared<FailingSink>();
  auto alongside = std::make_shared<RecordingSink>();
  engine.submit(Request{.prompt = prompt, .max_tokens = 4, .sampling = {.temperature = 0}, .top_logprobs = 0,
                        .prompt_logprobs = true},
                failing);
  engine.submit(greedy(other, 5), alongside);
  const infer::Outcome outcome = failing->wait();
  EXPECT_NE(outcome.error.find("the request's stream failed: the client went away"), std::string::npos)
      << outcome.error;
  EXPECT_EQ(failing->prompt_events.size(), 3u);
  EXPECT_TRUE(failing->events.empty());
  alongside->wait();
  EXPECT_EQ(alongside->tokens(), expected);
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
  // The failed prompt published nothing: the same prompt again finds no cached block.
  auto again = std::make_shared<RecordingSink>();
  engine.submit(greedy(prompt, 2), again);
  EXPECT_EQ(again->wait().cached_prompt_tokens, 0);
}

TEST_F(EngineTest, StoppedCancelledAndStopTokenRequestsReturnTheirBlocks) {
  Rng rng(testing::test_seed());
  std::vector<int32_t> prompt = random_prompt(rng, 20);
  const std::vector<int32_t> expected = generate(prompt, 20);
  Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  auto stopped = std::make_shared<RecordingSink>(3);  // the client stops after 3 tokens
  auto at_token = std::make_shared<RecordingSink>();
  auto cancelled = std::make_shared<RecordingSink>();
  engine.submit(greedy(prompt, 20), stopped);
  Request with_stop = greedy(prompt, 20);
  with_stop.stop_tokens = {expected[4]};
  engine.submit(with_stop, at_token);
  const uint64_t id = engine.submit(greedy(random_prompt(rng, 10), 30), cancelled);
  engine.cancel(id);
  infer::Outcome outcome = stopped->wait();
  EXPECT_EQ(outcome.reason, infer::FinishReason::stop);
  EXPECT_EQ(stopped->tokens(), std::vector<int32_t>(expected.begin(), expected.begin() + 3));
  outcome = at_token->wait();
  EXPECT_EQ(outcome.reason, infer::FinishReason::stop);
  const auto first_stop = std::find(expected.begin(), expected.end(), expected[4]);
  EXPECT_EQ(at_token->tokens(), std::vector<int32_t>(expected.begin(), first_stop + 1));
  outcome = cancelled->wait();
  EXPECT_TRUE(outcome.cancelled);
  EXPECT_EQ(outcome.error, "cancelled");
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
  EXPECT_EQ(engine.stats().running + engine.stats().waiting, 0);
}

TEST_F(EngineTest, InvalidRequestsNameTheirField) {
  Engine engine(config, trainer->parameters(), cpu_backend(), EngineOptions{.kv_cache_gb = 0.01});
  auto sink = std::make_shared<RecordingSink>();
  auto message = [&](Request request) {
    try {
      engine.submit(std::move(request), sink);
    } catch (const InputError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_PRED2(contains, message(greedy({}, 4)), std::string("prompt: must hold at least one token"));
  EXPECT_PRED2(contains, message(greedy({1, 67}, 4)), std::string("prompt: token id 67 at index 1"));
  EXPECT_PRED2(contains, message(greedy({1}, 0)), std::string("max_tokens: must be at least 1"));
  EXPECT_PRED2(contains, message(greedy(std::vector<int32_t>(40, 1), 9)),
               std::string("40 tokens plus max_tokens 9 exceed the model's context of 48"));
  Request request = greedy({1}, 2);
  request.sampling.top_p = 0;
  EXPECT_PRED2(contains, message(request), std::string("top_p"));
  request = greedy({1}, 2);
  request.top_logprobs = 21;
  EXPECT_PRED2(contains, message(request), std::string("logprobs"));
  EXPECT_EQ(engine.stats().running + engine.stats().waiting, 0);
}

// max_waiting counts requests that wait for a sequence slot: with none allowed, a request that
// finds a free slot still runs (it was refused as if the queue were full).
TEST_F(EngineTest, NoWaitingRoomStillRunsARequestThatFindsAFreeSlot) {
  Engine engine(config, trainer->parameters(), cpu_backend(),
                EngineOptions{.kv_cache_gb = 0.01, .max_num_seqs = 1, .max_batched_tokens = 1, .max_waiting = 0});
  auto sink = std::make_shared<RecordingSink>();
  engine.submit(greedy({1, 2, 3}, 4), sink);
  EXPECT_EQ(sink->wait().generated_tokens, 4);
}

// The queue check counts a request that the engine moved to its waiting queue and that waits
// while a step runs. (It was left out until the step ended: with room for one waiting request,
// a second was taken.)
TEST_F(EngineTest, ARequestCollectedBeforeAStepCountsAsWaitingDuringIt) {
  Engine engine(config, trainer->parameters(), cpu_backend(),
                EngineOptions{.kv_cache_gb = 0.01, .max_num_seqs = 1, .max_waiting = 1});
  // Holds the engine thread on each of its first two tokens until the test lets it go on.
  class SteppingSink : public RecordingSink {
   public:
    bool on_token(const infer::TokenEvent& event) override {
      const size_t index = events.size();
      if (index < 2) {
        arrived[index].set_value();
        go[index].get_future().wait();
      }
      return RecordingSink::on_token(event);
    }
    std::promise<void> arrived[2], go[2];
  };
  auto running = std::make_shared<SteppingSink>();
  engine.submit(greedy({1}, 6), running);
  running->arrived[0].get_future().wait();  // in its first step
  auto waiting = std::make_shared<RecordingSink>();
  engine.submit(greedy({2}, 3), waiting);    // the one place in the queue
  running->go[0].set_value();
  running->arrived[1].get_future().wait();  // the next step: the second request waits in the engine's queue
  EXPECT_THROW(engine.submit(greedy({3}, 3), std::make_shared<RecordingSink>()), infer::QueueFull);
  running->go[1].set_value();
  EXPECT_EQ(running->wait().generated_tokens, 6);
  EXPECT_EQ(waiting->wait().generated_tokens, 3);
}

TEST_F(EngineTest, AFullQueueRefusesAndDrainCancelsWhatOutlivesTheGrace) {
  Engine engine(config, trainer->parameters(), cpu_backend(),
                EngineOptions{.kv_cache_gb = 0.01, .max_num_seqs = 1, .max_batched_tokens = 1, .max_waiting = 2});
  // A sink that holds the engine thread on its first token: the requests behind it wait.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  class HoldingSink : public RecordingSink {
   public:
    explicit HoldingSink(std::shared_future<void> gate) : gate_(std::move(gate)) {}
    bool on_token(const infer::TokenEvent& event) override {
      gate_.wait();
      return RecordingSink::on_token(event);
    }
   private:
    std::shared_future<void> gate_;
  };
  auto holding = std::make_shared<HoldingSink>(released);
  engine.submit(greedy({1, 2, 3}, 40), holding);
  while (engine.stats().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<std::shared_ptr<RecordingSink>> queued;
  for (int i = 0; i < 2; ++i) {
    queued.push_back(std::make_shared<RecordingSink>());
    engine.submit(greedy({4, 5}, 40), queued.back());
  }
  EXPECT_THROW(engine.submit(greedy({6}, 4), std::make_shared<RecordingSink>()), infer::QueueFull);
  std::thread drain([&] { engine.drain(std::chrono::milliseconds(50)); });
  while (true) {  // draining refuses new requests at once
    try {
      engine.submit(greedy({6}, 4), std::make_shared<RecordingSink>());
    } catch (const infer::Draining&) {
      break;
    } catch (const infer::QueueFull&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The engine thread stays held past the grace period: every request left is then cancelled.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  release.set_value();
  drain.join();
  for (auto& sink : queued) {
    infer::Outcome outcome = sink->wait();
    EXPECT_TRUE(outcome.cancelled);
    EXPECT_PRED2(contains, outcome.error, std::string("did not finish within the grace period"));
    EXPECT_TRUE(sink->events.empty());
  }
  EXPECT_TRUE(holding->wait().cancelled);
  EXPECT_EQ(engine.stats().blocks_free, engine.stats().blocks_total);
}


}  // namespace
}  // namespace paraflow
