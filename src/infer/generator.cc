#include "infer/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"

namespace paraflow::infer {

Generator::Generator(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend,
                     DType weights)
    : config_(config),
      parameters_(parameters),
      backend_(backend),
      weights_(weights),
      logits_(static_cast<size_t>(config.vocab_size)) {
  const Shape cache{1, config.kv_heads(), config.n_positions, config.head_size()};
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    caches_.emplace_back(backend.empty(cache, DType::f32), backend.empty(cache, DType::f32));
  }
  // The decode graph now, and with it the weights' copy: load work, not the first prompt's.
  step_for(1);
}

Generator::Step& Generator::step_for(int64_t new_tokens) {
  auto found = steps_.find(new_tokens);
  if (found != steps_.end()) return found->second;
  // Build the graph in its final map slot: the executor keeps a reference to it.
  auto slot = steps_.emplace(new_tokens, Step{}).first;
  try {  // a failed build leaves no half-built step behind
    model::GptGraph& g = slot->second.graph;
    g = model::build_gpt_decode_graph(config_, 1, new_tokens, config_.n_positions);
    // Every step's graph reads its weights in the same layouts (none depends on the token count).
    const model::StoredLayouts layouts = model::use_weights_for_decoding(g, backend_, weights_, &parameters_);
    if (!decoding_parameters_) {
      decoding_parameters_ = model::decoding_copy(parameters_, backend_, weights_, layouts, model::half_parameter_names(g));
    }
    slot->second.executor = std::make_unique<graph::Executor>(g.graph, backend_);
    slot->second.executor->set_profiling(profiling_);
    model::bind_decoding_parameters(*slot->second.executor, g, parameters_, *decoding_parameters_);
    for (size_t layer = 0; layer < caches_.size(); ++layer) {
      slot->second.executor->bind(slot->second.graph.caches[layer].first, caches_[layer].first);
      slot->second.executor->bind(slot->second.graph.caches[layer].second, caches_[layer].second);
    }
  } catch (...) {
    steps_.erase(slot);
    throw;
  }
  return slot->second;
}

const std::vector<float>& Generator::run(Step& step, const int32_t* tokens, int64_t count) {
  check(position_ + count <= config_.n_positions, "sequence of {} tokens exceeds the model's context of {}",
        position_ + count, config_.n_positions);
  for (int64_t i = 0; i < count; ++i) {
    check(tokens[i] >= 0 && tokens[i] < config_.vocab_size, "token id {} is outside the vocabulary of {}", tokens[i],
          config_.vocab_size);
  }
  graph::Executor& executor = *step.executor;
  backend_.upload(tokens, executor.tensor(step.graph.tokens));
  executor.tensor(step.graph.position).data<int32_t>()[0] = static_cast<int32_t>(position_);  // host memory
  executor.forward();
  position_ += count;
  backend_.download(executor.tensor(step.graph.logits).slice_flat((count - 1) * config_.vocab_size, config_.vocab_size),
                    logits_.data());
  return logits_;
}

const std::vector<float>& Generator::prefill(const std::vector<int32_t>& tokens) {
  check(!tokens.empty(), "the prompt must hold at least one token");
  position_ = 0;
  return run(step_for(static_cast<int64_t>(tokens.size())), tokens.data(), static_cast<int64_t>(tokens.size()));
}

const std::vector<float>& Generator::decode(int32_t token) { return run(step_for(1), &token, 1); }

std::vector<double> Generator::log_likelihoods(const std::vector<int32_t>& tokens) {
  check(tokens.size() >= 2, "log_likelihoods: {} tokens predict none (two at least)", tokens.size());
  const auto count = static_cast<int64_t>(tokens.size());
  Step& step = step_for(count);
  position_ = 0;
  run(step, tokens.data(), count);
  const Tensor logits = backend_.on_host(step.executor->tensor(step.graph.logits));
  const float* all = logits.data<float>();
  std::vector<double> result(tokens.size() - 1);
  for (int64_t t = 0; t + 1 < count; ++t) {
    // log softmax at the next token, in double, from the row's largest logit.
    const float* row = all + t * config_.vocab_size;
    const double largest = *std::max_element(row, row + config_.vocab_size);
    double sum = 0;
    for (int64_t v = 0; v < config_.vocab_size; ++v) sum += std::exp(static_cast<double>(row[v]) - largest);
    result[static_cast<size_t>(t)] = static_cast<double>(row[tokens[static_cast<size_t>(t + 1)]]) - largest - std::log(sum);
  }
  return result;
}

Generation Generator::generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, Sampler& sampler,
                              const std::function<bool(int32_t)>& on_token) {
  Generation result;
  if (max_new_tokens <= 0) return result;
  result.tokens.reserve(static_cast<size_t>(max_new_tokens));
  auto start = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &prefill(prompt);
  while (true) {
    const int32_t token = sampler.sample(logits->data(), config_.vocab_size);
    if (result.tokens.empty()) {
      result.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      start = std::chrono::steady_clock::now();
    }
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish_reason = FinishReason::stop;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) >= max_new_tokens) break;
    if (position_ >= config_.n_positions) {
      result.context_full = true;
      break;
    }
    logits = &decode(token);
  }
  if (result.tokens.size() > 1) {
    result.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return result;
}

void Generator::set_profiling(bool enabled) {
  profiling_ = enabled;
  for (auto& [count, step] : steps_) step.executor->set_profiling(enabled);
}

std::map<std::string, double> Generator::profile() const {
  std::map<std::string, double> total;
  for (const auto& [count, step] : steps_) {
    for (const auto& [key, seconds] : step.executor->profile()) total[key] += seconds;
  }
  return total;
}

Perplexity perplexity(Generator& generator, const std::vector<int32_t>& tokens, int64_t context, bool second_half) {
  const int64_t least = second_half ? 3 : 2;  // to score one token
  check(context >= least, "perplexity: a window of {} tokens scores none ({} at least)", context, least);
  check(tokens.size() >= 2, "perplexity: the text is {} token(s); two at least are needed", tokens.size());
  const auto window = static_cast<size_t>(context);
  check(!second_half || tokens.size() >= window,
        "perplexity: the text is {} tokens, not one whole window of {} (second halves are scored in whole windows only)",
        tokens.size(), context);
  // Predictions [first, window - 1) of a window are scored (prediction t is of token t + 1).
  const size_t first = second_half ? window / 2 : 0;
  Perplexity result;
  double total = 0;
  for (size_t begin = 0; begin + 1 < tokens.size(); begin += window) {
    const size_t end = std::min(tokens.size(), begin + window);
    if (end - begin < 2 || (second_half && end - begin < window)) break;  // nothing (more) to score
    const std::vector<double> log_likelihoods = generator.log_likelihoods({tokens.begin() + begin, tokens.begin() + end});
    for (size_t t = first; t < log_likelihoods.size(); ++t) {
      total -= log_likelihoods[t];
      ++result.scored;
    }
    ++result.windows;
  }
  result.mean_nll = total / static_cast<double>(result.scored);
  result.perplexity = std::exp(result.mean_nll);
  return result;
}

const char* finish_reason_name(FinishReason reason) { return reason == FinishReason::stop ? "stop" : "length"; }

}  // namespace paraflow::infer
