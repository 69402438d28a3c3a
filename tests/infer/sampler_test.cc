// The sampler: greedy picks the argmax, top-k/top-p restrict the support, sampled frequencies
// follow softmax(logits / temperature) (a chi-square test against the exact law), and OpenAI's
// frequency and presence penalties and logit biases move the choice as their formula says
// (sequences worked out by hand).
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "infer/sampler.h"

namespace paraflow {
namespace {

const std::vector<float> kLogits{1.0f, 3.0f, 0.5f, 2.5f, -1.0f};

TEST(Sampler, GreedyAndTopKOneAreArgmax) {
  infer::Sampler greedy({0.0, 0, 1.0, 1});
  EXPECT_EQ(greedy.sample(kLogits.data(), 5), 1);
  infer::Sampler top1({1.0, 1, 1.0, 1});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(top1.sample(kLogits.data(), 5), 1);
}

// A vocabulary of whole vector blocks and a remainder: greedy takes the first of tied maxima,
// wherever they fall (in a block or in the remainder), and token 0 when every logit is -inf.
TEST(Sampler, GreedyTakesTheFirstOfTiedMaxima) {
  infer::Sampler greedy({0.0, 0, 1.0, 1});
  std::vector<float> logits(1003);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 97) * 0.01f;  // largest 0.96
  EXPECT_EQ(greedy.sample(logits.data(), 1003), 96);  // also at 193, 290, ...
  logits[1002] = 5.0f;
  EXPECT_EQ(greedy.sample(logits.data(), 1003), 1002);
  logits[517] = 5.0f;
  EXPECT_EQ(greedy.sample(logits.data(), 1003), 517);
  std::fill(logits.begin(), logits.end(), -INFINITY);
  EXPECT_EQ(greedy.sample(logits.data(), 1003), 0);
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  infer::Sampler top2({1.0, 2, 1.0, 2});
  infer::Sampler nucleus({1.0, 0, 0.5, 3});  // p(1) = 0.52 alone reaches 0.5
  for (int i = 0; i < 500; ++i) {
    int32_t token = top2.sample(kLogits.data(), 5);
    EXPECT_TRUE(token == 1 || token == 3) << token;
    EXPECT_EQ(nucleus.sample(kLogits.data(), 5), 1);
  }
}

TEST(Sampler, FrequenciesFollowTheTemperedSoftmax) {
  const double temperature = 1.5;
  const int draws = 20000;
  infer::Sampler sampler({temperature, 0, 1.0, 42});
  std::vector<int> counts(5, 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.sample(kLogits.data(), 5))];
  double sum = 0;
  std::vector<double> expected(5);
  for (size_t i = 0; i < 5; ++i) sum += expected[i] = std::exp(kLogits[i] / temperature);
  double chi_square = 0;
  for (size_t i = 0; i < 5; ++i) {
    double e = expected[i] / sum * draws;
    chi_square += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
  EXPECT_LT(chi_square, 18.47);
}

// A NaN or +inf logit is reported, greedy or sampled, naming the token (a NaN made every draw
// return one fixed token, whatever the seed).
TEST(Sampler, NonFiniteLogitsAreReported) {
  for (float bad : {std::nanf(""), INFINITY}) {
    const std::vector<float> logits{1.0f, bad, 2.0f, 0.5f};
    for (double temperature : {0.0, 1.0}) {
      infer::Sampler sampler({.temperature = temperature, .seed = 3});
      try {
        sampler.sample(logits.data(), 4);
        ADD_FAILURE() << "sampled past logit " << bad << " at temperature " << temperature;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the logit of token 1 is"), std::string::npos) << e.what();
      }
    }
  }
  const std::vector<float> masked{1.0f, -INFINITY, 2.0f};  // -inf is a token never to pick, not an error
  EXPECT_EQ(infer::Sampler({.temperature = 0}).sample(masked.data(), 3), 2);
}

std::vector<int32_t> greedy_run(const infer::SamplingConfig& config, const std::vector<float>& logits, int steps) {
  infer::Sampler sampler(config);
  std::vector<int32_t> tokens;
  for (int i = 0; i < steps; ++i) tokens.push_back(sampler.sample(logits.data(), static_cast<int64_t>(logits.size())));
  return tokens;
}

// Logits (2.0, 1.5, 0.0) every step, greedy. Presence 1.0: token 0 (2.0), then 0 at 1.0 against
// 1 at 1.5 gives 1, then both penalised once (1.0, 0.5): 0 from then on. Frequency 0.6: 0, then
// (1.4, 1.5): 1, (1.4, 0.9): 0, (0.8, 0.9): 1, (0.8, 0.3): 0, (0.2, 0.3): 1, (0.2, -0.3): 0, then
// (-0.4, -0.3) leaves token 2 (0.0) the likeliest.
TEST(Sampler, PenaltiesLowerTheTokensAlreadyChosen) {
  const std::vector<float> logits{2.0f, 1.5f, 0.0f};
  EXPECT_EQ(greedy_run({.temperature = 0}, logits, 4), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(greedy_run({.temperature = 0, .presence_penalty = 1.0}, logits, 5), (std::vector<int32_t>{0, 1, 0, 0, 0}));
  EXPECT_EQ(greedy_run({.temperature = 0, .frequency_penalty = 0.6}, logits, 9),
            (std::vector<int32_t>{0, 1, 0, 1, 0, 1, 0, 2, 1}));
  // A negative penalty favours repeating: token 0 only.
  EXPECT_EQ(greedy_run({.temperature = 0, .frequency_penalty = -0.5}, logits, 4), (std::vector<int32_t>{0, 0, 0, 0}));
}

// A bias of -100 bans a token and +100 forces one, greedy or sampled; a moderate bias moves the
// sampled law to softmax(logits + bias).
TEST(Sampler, LogitBiasIsAddedToTheLogits) {
  EXPECT_EQ(greedy_run({.temperature = 0, .logit_bias = {{1, -100.0f}}}, kLogits, 1), (std::vector<int32_t>{3}));
  infer::Sampler forced({.temperature = 1.0, .seed = 5, .logit_bias = {{4, 100.0f}}});
  infer::Sampler banned({.temperature = 1.0, .seed = 6, .logit_bias = {{1, -100.0f}, {3, -100.0f}}});
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(forced.sample(kLogits.data(), 5), 4);
    const int32_t token = banned.sample(kLogits.data(), 5);
    EXPECT_TRUE(token != 1 && token != 3) << token;
  }
  // Logits (0, 0, 0, 0) with token 0 biased by ln 3: p = (1/2, 1/6, 1/6, 1/6).
  const std::vector<float> flat(4, 0.0f);
  infer::Sampler biased({.temperature = 1.0, .seed = 7, .logit_bias = {{0, static_cast<float>(std::log(3.0))}}});
  const int draws = 12000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(biased.sample(flat.data(), 4))];
  double chi_square = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double e = (i == 0 ? 0.5 : 1.0 / 6) * draws;
    chi_square += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi_square, 16.27);  // 3 degrees of freedom: P(chi2 > 16.27) = 0.001
}

TEST(Sampler, BadSettingsAreRefused) {
  EXPECT_THROW(infer::Sampler({-1.0, 0, 1.0, 0}), InputError);
  EXPECT_THROW(infer::Sampler({1.0, 0, 0.0, 0}), InputError);
  EXPECT_THROW(infer::Sampler({1.0, -2, 1.0, 0}), InputError);
  EXPECT_THROW(infer::Sampler({.frequency_penalty = 2.5}), InputError);
  EXPECT_THROW(infer::Sampler({.presence_penalty = -2.1}), InputError);
  EXPECT_THROW(infer::Sampler({.logit_bias = {{3, 100.5f}}}), InputError);
  EXPECT_THROW(infer::Sampler({.logit_bias = {{-1, 1.0f}}}), InputError);
  infer::Sampler beyond({.logit_bias = {{5, 1.0f}}});
  try {
    beyond.sample(kLogits.data(), 5);
    ADD_FAILURE() << "a bias for a token beyond the vocabulary was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 5 is outside the vocabulary of 5 tokens"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace paraflow
