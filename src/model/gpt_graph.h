// Builds the GPT-2 dataflow graph from a config. The model is code that builds a graph; it calls
// no kernels.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/executor.h"
#include "graph/graph.h"
#include "graph/precision.h"
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
  // 16-bit copies of parameters that a precision policy gave to ops taking 16-bit inputs.
  std::map<std::string, graph::ValueId> half_parameters;  // by TensorSpec name
};

// Records a precision policy's 16-bit parameter copies in g.half_parameters.
void name_half_parameters(GptGraph& g, const graph::PrecisionPlan& plan);
// The 16-bit copies `g` reads, converted from `parameters` (an empty set when it reads none).
ParameterSet make_half_parameters(const GptGraph& g, const ParameterSet& parameters, Backend& backend, DType dtype);

// Forward graph with the loss; call graph::add_backward_pass(g.graph, g.losses) to train.
GptGraph build_gpt_training_graph(const GptConfig& config, int64_t batch, int64_t sequence);

// Forward-only graph for generation: `new_tokens` positions starting at the `position` input,
// with per-layer KV caches (state values of (B, n_head, max_sequence, head size)).
GptGraph build_gpt_decode_graph(const GptConfig& config, int64_t batch, int64_t new_tokens, int64_t max_sequence);

// Binds every parameter of `graph` to its view in `parameters` (and, when given, every
// parameter gradient to its view in `gradients`, a ParameterSet with the same specs). The
// 16-bit copies, if the graph has any, go to their views in `half_parameters`, their gradients to
// the f32 parameters' gradients.
void bind_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                     const ParameterSet* gradients, const ParameterSet* half_parameters = nullptr);

}  // namespace paraflow::model
