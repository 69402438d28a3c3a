#include "train/batch_source.h"

namespace paraflow::train {

void check_tokens_fit(const BatchSource& data, int64_t vocab_size) {
  if (data.refuses_tokens_past(vocab_size)) return;
  const int32_t max_token = data.max_token();
  check(max_token < vocab_size, "the data holds token id {} but model.vocab_size is {}", max_token, vocab_size);
}

double forward_batch(graph::Executor& executor, const model::GptGraph& graph, BatchSource& data,
                     const BatchPosition& position) {
  Backend& backend = executor.backend();
  const Tensor& tokens = executor.tensor(graph.tokens);
  const Tensor& targets = executor.tensor(graph.targets);
  Tensor host_tokens = backend.on_host(tokens), host_targets = backend.on_host(targets);
  data.batch(position.index, position.seed, position.validation, position.slice, position.slices, host_tokens,
             host_targets);
  backend.upload(host_tokens.raw(), tokens);
  backend.upload(host_targets.raw(), targets);
  executor.forward();
  return mean_loss(executor, graph);
}

double mean_loss(graph::Executor& executor, const model::GptGraph& graph) {
  const std::vector<float> losses = executor.backend().download<float>(executor.tensor(graph.losses));
  double sum = 0;
  for (float loss : losses) sum += loss;
  return sum / static_cast<double>(losses.size());
}

}  // namespace paraflow::train
