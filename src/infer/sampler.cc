#include "infer/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace paraflow::infer {

Sampler::Sampler(const SamplingConfig& config) : config_(config), rng_(config.seed) {
  check(config.temperature >= 0, "--temperature must be >= 0, got {}", config.temperature);
  check(config.top_k >= 0, "--top-k must be >= 0, got {}", config.top_k);
  check(config.top_p > 0 && config.top_p <= 1, "--top-p must be in (0, 1], got {}", config.top_p);
  check(std::abs(config.frequency_penalty) <= 2, "frequency penalty must be in [-2, 2], got {}",
        config.frequency_penalty);
  check(std::abs(config.presence_penalty) <= 2, "presence penalty must be in [-2, 2], got {}",
        config.presence_penalty);
  for (const auto& [token, bias] : config.logit_bias) {
    check(token >= 0, "logit_bias: token id {} is negative", token);
    check(std::abs(bias) <= 100, "logit_bias: the bias of token {} must be in [-100, 100], got {}", token, bias);
  }
  adjusts_ = config.frequency_penalty != 0 || config.presence_penalty != 0 || !config.logit_bias.empty();
}

int32_t Sampler::sample(const float* logits, int64_t vocab_size) {
  const int32_t token = choose(adjust(logits, vocab_size), vocab_size);
  if (config_.frequency_penalty != 0 || config_.presence_penalty != 0) ++chosen_[token];
  return token;
}

const float* Sampler::adjust(const float* logits, int64_t vocab_size) {
  if (!adjusts_) return logits;
  adjusted_.assign(logits, logits + vocab_size);
  for (const auto& [token, count] : chosen_) {
    adjusted_[static_cast<size_t>(token)] -= static_cast<float>(count * config_.frequency_penalty + config_.presence_penalty);
  }
  for (const auto& [token, bias] : config_.logit_bias) {
    check(token < vocab_size, "logit_bias: token id {} is outside the vocabulary of {} tokens", token, vocab_size);
    adjusted_[static_cast<size_t>(token)] += bias;
  }
  return adjusted_.data();
}

int32_t Sampler::choose(const float* logits, int64_t vocab_size) {
  // NaN (or +inf, whose softmax is NaN) would make any choice arbitrary, the same whatever the
  // seed: a model whose weights or activations overflowed is reported instead. (One pass of
  // integer compares and a max without an early exit, so that it vectorises: it runs for every
  // token of every sequence.)
  constexpr uint32_t kInfinity = 0x7f800000;  // the bits of +inf; past it (sign aside): NaN
  uint32_t overflowed = 0;
  float max_logit = -INFINITY;
#pragma omp simd reduction(| : overflowed) reduction(max : max_logit)
  for (int64_t i = 0; i < vocab_size; ++i) {
    const float logit = logits[i];
    const uint32_t bits = std::bit_cast<uint32_t>(logit);
    overflowed |= static_cast<uint32_t>((bits & 0x7fffffff) > kInfinity) | static_cast<uint32_t>(bits == kInfinity);
    max_logit = logit > max_logit ? logit : max_logit;  // (GCC 12 keeps std::max's references scalar)
  }
  if (overflowed != 0) {
    const float* bad = std::find_if(logits, logits + vocab_size, [](float x) { return !(x < INFINITY); });
    fail("sampling: the logit of token {} is {}: the model's weights or activations have overflowed", bad - logits, *bad);
  }
  if (config_.temperature == 0) {  // the first token of the largest logit (every one -inf: token 0)
    const float* best = std::find(logits, logits + vocab_size, max_logit);
    return best == logits + vocab_size ? 0 : static_cast<int32_t>(best - logits);
  }
  // Candidates sorted by logit (stable on ties: lower id first), cut by top-k. Without top-k or
  // top-p the order does not matter: the whole vocabulary in id order, no sort (a sixth of a
  // GPT-2 decode step otherwise).
  std::vector<int32_t>& order = order_;
  order.resize(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = config_.top_k > 0 ? std::min(config_.top_k, vocab_size) : vocab_size;
  if (keep < vocab_size || config_.top_p < 1) {
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    order.resize(static_cast<size_t>(keep));
  }
  std::vector<double>& probs = probs_;
  probs.resize(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += probs[i] = std::exp((logits[order[i]] - static_cast<double>(max_logit)) / config_.temperature);
  // Nucleus: the smallest prefix whose probability reaches top_p.
  double cumulative = 0;
  size_t cut = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    cumulative += probs[i] / sum;
    if (cumulative >= config_.top_p) {
      cut = i + 1;
      break;
    }
  }
  double total = std::accumulate(probs.begin(), probs.begin() + static_cast<std::ptrdiff_t>(cut), 0.0);
  double draw = rng_.uniform() * total;
  size_t last_possible = 0;  // rounding may leave draw >= 0 after the last subtraction
  for (size_t i = 0; i < cut; ++i) {
    draw -= probs[i];
    if (draw < 0) return order[i];
    if (probs[i] > 0) last_possible = i;
  }
  return order[last_possible];
}

}  // namespace paraflow::infer
