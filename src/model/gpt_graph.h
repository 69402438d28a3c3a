// Builds the GPT-2 dataflow graph from a config. The model is code that builds a graph; it calls
// no kernels.
#pragma once

#include <map>
#include <set>
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
  graph::ValueId position = graph::kNoValue; // i32: (1) first position (decode) or (N) each token's (serving)
  graph::ValueId block_tables = graph::kNoValue;  // (N, max_blocks) i32 input; serving decoder only
  graph::ValueId hidden = graph::kNoValue;   // (N,1,C) final layernorm: the serving decoder's output, the head's input
  // A pipeline stage's boundary: the residual stream (B,T,C) f32 received from the previous
  // stage (an input) and sent to the next (an activation).
  graph::ValueId stage_input = graph::kNoValue;
  graph::ValueId stage_output = graph::kNoValue;
  // Per layer (k, v): the KV caches of decode graphs, the KV block pools of the serving decoder.
  std::vector<std::pair<graph::ValueId, graph::ValueId>> caches;
  std::map<std::string, graph::ValueId> parameters;  // by TensorSpec name
  // 16-bit copies of parameters that a precision policy gave to ops taking 16-bit inputs.
  std::map<std::string, graph::ValueId> half_parameters;  // by TensorSpec name
  // Token embedding tables a decoding graph reads as their model file stores them
  // (ParameterSet::stored_rows), by TensorSpec name.
  std::map<std::string, graph::ValueId> stored_tables;
};

// Serving's ragged batch, as two graphs so that only the rows that need logits pay for the
// vocabulary projection. The decoder runs up to `max_tokens` tokens of many sequences at once,
// each at its own position (g.position, (N) i32) with its sequence's block table, over per-layer
// KV block pools of `kv_blocks` blocks of `block_size` positions (state, in `kv_dtype`: f32 or
// bf16), and outputs g.hidden.
// The head maps up to `max_rows` hidden rows (of the decoder's hidden dtype) to f32 logits. Run
// fewer rows with Executor::set_rows.
GptGraph build_gpt_serving_decoder(const GptConfig& config, int64_t max_tokens, int64_t kv_blocks, int64_t block_size,
                                   DType kv_dtype = DType::f32);
GptGraph build_gpt_serving_head(const GptConfig& config, int64_t max_rows, DType hidden = DType::f32);

// Decoding's weights for a forward-only graph, in `weights`:
// - float32: the linear layers' weights themselves stored [out, in] (the [in, out] layout splits
//   each weight row between the threads), and interleaved where `backend` prefers it, for the
//   few-rows decoding kernel, wte too (the embedding then reads it interleaved, as the tied head
//   does). Bind a copy of the parameters made with the layouts (converted_copy to f32).
// - bfloat16: applies mixed_bfloat16 (logits kept f32; the serving decoder's hidden output
//   becomes bf16) and stores the linear layers' 16-bit weights [out, in], those weights (the
//   head's too) interleaved or tiled where `backend` prefers it.
// - float16: every matmul's weight (the head's too) read from a float16 copy stored [out, in]
//   (out_in_tiles for half arithmetic where the CPU has AVX512_FP16: backend/cpu/half_products.h),
//   activations f32.
// - q8_0, q4_k: every matmul's weight (the head's too) read from a Q8_0 or Q4_K copy stored [out,
//   in] (its input features a multiple of 32, or 256), activations f32 (quantized per row by the
//   kernel).
// With 16-bit weights the graph reads the f32 parameters for the rest (bind_parameters with the
// 16-bit copy as half_parameters); g.parameters then lists only the f32 values a node still
// reads. Returns the layouts, for ParameterSet::converted_copy. Fails with a message naming the
// backend where it has no matmul for those weights. With 16-bit or
// quantized weights and `parameters` given, the embedding reads the token table where its file
// holds it, in the file's type (a GGUF file's blocks, a bf16 file's values: g.stored_tables), when
// `parameters` holds it so (ParameterSet::stored_rows) and the backend's embedding reads that
// type: the table is then never read into f32 (Qwen2.5-0.5B's would take 545 MB).
StoredLayouts use_weights_for_decoding(GptGraph& g, Backend& backend, DType weights,
                                       const ParameterSet* parameters = nullptr);

// Records a precision policy's 16-bit parameter copies in g.half_parameters.
void name_half_parameters(GptGraph& g, const graph::PrecisionPlan& plan);
// The 16-bit copies `g` reads, converted from `parameters` (an empty set when it reads none).
ParameterSet make_half_parameters(const GptGraph& g, const ParameterSet& parameters, Backend& backend, DType dtype);
// The names of the parameters whose 16-bit (or quantized) copies `g` reads.
std::set<std::string> half_parameter_names(const GptGraph& g);

// Forward graph with the loss; call graph::add_backward_pass(g.graph, g.losses) to train. For a
// pipeline stage other than the last, the graph ends at g.stage_output instead (no loss); stages
// after the first start from g.stage_input instead of the tokens. A tensor-parallel `shard` holds
// shard_tensor_specs' parameters and needs its group (Executor::set_collective_group).
GptGraph build_gpt_training_graph(const GptConfig& config, int64_t batch, int64_t sequence,
                                  const LayerRange& range = {}, const TensorShard& shard = {});

// Forward-only graph for generation: `new_tokens` positions starting at the `position` input,
// with per-layer KV caches (state values of (B, n_head, max_sequence, head size)).
GptGraph build_gpt_decode_graph(const GptConfig& config, int64_t batch, int64_t new_tokens, int64_t max_sequence);

// Binds every parameter of `graph` to its view in `parameters` (and, when given, every
// parameter gradient to its view in `gradients`, a ParameterSet with the same specs). The
// 16-bit copies, if the graph has any, go to their views in `half_parameters`, their gradients to
// the f32 parameters' gradients.
void bind_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                     const ParameterSet* gradients, const ParameterSet* half_parameters = nullptr);

// What decoding with `weights` copies of `parameters` (use_weights_for_decoding's `layouts`): the
// weights the graphs read in a 16-bit or quantized type (`half_names`), or in f32 only those stored
// in another layout; every other is read where it is (in place in a mapped file: loaded once).
ParameterSet decoding_copy(const ParameterSet& parameters, Backend& backend, DType weights,
                           const StoredLayouts& layouts, const std::set<std::string>& half_names);
// Binds a decoding graph's weights: each from `copy` (decoding_copy's) where it holds it, every
// other from `parameters` (a table read as stored from its file's rows).
void bind_decoding_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                              const ParameterSet& copy);

}  // namespace paraflow::model
