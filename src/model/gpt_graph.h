// Builds the GPT-2 dataflow graph from a config. The model is code that builds a graph; it calls
// no kernels.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/executor.h"
#include "graph/graph.h"
#include "model/gpt_config.h"
#include "model/parameters.h"

namespace paraflow::model {

struct GptGraph {
  graph::Graph graph;
  graph::ValueId tokens = graph::kNoValue;   // (B,T) i32 input
  graph::ValueId targets = graph::kNoValue;  // (B,T) i32 input; training graphs only
  graph::ValueId logits = graph::kNoValue;   // (B,T,V)
  graph::ValueId losses = graph::kNoValue;   // (B,T); training graphs only
  graph::ValueId position = graph::kNoValue; // (1) i32 first position; decode graphs only
  std::vector<std::pair<graph::ValueId, graph::ValueId>> caches;  // per layer (k, v); decode only
  std::map<std::string, graph::ValueId> parameters;  // by TensorSpec name
};

// Forward graph with the loss; call graph::add_backward_pass(g.graph, g.losses) to train.
GptGraph build_gpt_training_graph(const GptConfig& config, int64_t batch, int64_t sequence);

// Forward-only graph for generation: `new_tokens` positions starting at the `position` input,
// with per-layer KV caches (state values of (B, n_head, max_sequence, head size)).
GptGraph build_gpt_decode_graph(const GptConfig& config, int64_t batch, int64_t new_tokens, int64_t max_sequence);

// Binds every parameter of `graph` to its view in `parameters` (and, when given, every
// parameter gradient to its view in `gradients`, a ParameterSet with the same specs).
void bind_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                     const ParameterSet* gradients);

}  // namespace paraflow::model
