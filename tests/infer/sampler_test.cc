// The sampler: greedy picks the argmax, top-k/top-p restrict the support, and sampled
// frequencies follow softmax(logits / temperature) (a chi-square test against the exact law).
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

TEST(Sampler, BadSettingsAreRefused) {
  EXPECT_THROW(infer::Sampler({-1.0, 0, 1.0, 0}), InputError);
  EXPECT_THROW(infer::Sampler({1.0, 0, 0.0, 0}), InputError);
  EXPECT_THROW(infer::Sampler({1.0, -2, 1.0, 0}), InputError);
}

}  // namespace
}  // namespace paraflow
