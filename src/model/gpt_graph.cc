#include "model/gpt_graph.h"

#include "graph/executor.h"
#include "graph/weight_layout.h"

namespace paraflow::model {

using graph::Attributes;
using graph::OpKind;
using graph::ValueId;
using graph::ValueRole;

namespace {

// The decoder stack shared by every graph: embedding, n_layer blocks and the final layernorm —
// or, for a pipeline stage, the blocks of `range`, starting from g.stage_input unless it is the
// first stage and returning the residual stream unless it is the last.
// `attention_core` adds one block's attention core given its qkv value and the core's attributes
// (n_head and the layer's score scale).
// `linear` holds the attributes every matmul of the stack shares (decoding's forward_only, serving's
// row_invariant).
// A tensor-parallel `shard` runs its heads and its part of the MLP between tp_copy and tp_reduce.
template <typename AttentionBuilder>
ValueId add_decoder(GptGraph& g, const GptConfig& config, ValueId position, AttentionBuilder attention_core,
                    Attributes linear = {}, const LayerRange& range = {}, const TensorShard& shard = {}) {
  graph::Graph& graph = g.graph;
  check(config.n_head % shard.size == 0, "dist.tensor_parallel ({}) must divide model.n_head ({})", shard.size,
        config.n_head);
  for (const TensorSpec& spec : part_tensor_specs(gpt_tensor_specs(config), range, shard)) {
    g.parameters[spec.name] = graph.add_value(spec.name, spec.shape, DType::f32, ValueRole::parameter);
  }
  auto param = [&](const std::string& name) { return g.parameters.at(name); };
  Attributes layernorm = Attributes().set_float("eps", config.layer_norm_epsilon);
  linear.set("layout", static_cast<int64_t>(WeightLayout::in_out));
  Attributes linear_gelu = Attributes(linear).set("gelu", 1);
  const bool parallel = shard.size > 1;
  // Into a tensor-parallel region and out of it (identities without tensor parallelism).
  auto enter = [&](const std::string& name, ValueId x) {
    return parallel ? graph.add_node(OpKind::tp_copy, name, {x})[0] : x;
  };
  auto leave = [&](const std::string& name, ValueId x) {
    return parallel ? graph.add_node(OpKind::tp_reduce, name, {x})[0] : x;
  };
  // A row-split layer's shards add partial products; shard 0 alone adds the bias.
  auto row_split_inputs = [&](ValueId x, const std::string& weight, const std::string& bias) {
    std::vector<ValueId> inputs{x, param(weight)};
    if (shard.rank == 0) inputs.push_back(param(bias));
    return inputs;
  };

  ValueId x = g.stage_input;
  if (range.first) {
    std::vector<ValueId> embed_inputs{g.tokens, param("wte.weight"), param("wpe.weight")};
    if (position != graph::kNoValue) embed_inputs.push_back(position);
    // Vocabulary-parallel: each shard looks up its rows of wte, shard 0 adds the positions.
    Attributes embed = Attributes()
                           .set("vocab_begin", shard.rank * (config.vocab_size / shard.size))
                           .set("add_positions", shard.rank == 0 ? 1 : 0);
    x = leave("embed.tp_reduce", graph.add_node(OpKind::embedding, "embed", embed_inputs, embed)[0]);
  }
  for (int64_t layer = range.first_layer; layer < config.n_layer && range.holds_layer(layer); ++layer) {
    std::string h = "h." + std::to_string(layer) + ".";
    ValueId ln1 = graph.add_node(OpKind::layernorm, h + "ln_1", {x, param(h + "ln_1.weight"), param(h + "ln_1.bias")},
                                 layernorm)[0];
    ValueId qkv = graph.add_node(OpKind::matmul, h + "attn.c_attn",
                                 {enter(h + "attn.tp_copy", ln1), param(h + "attn.c_attn.weight"),
                                  param(h + "attn.c_attn.bias")},
                                 linear)[0];
    Attributes core =
        Attributes().set("n_head", config.n_head / shard.size).set_float("scale", config.attention_scale(layer));
    ValueId attention = attention_core(h, qkv, core);
    ValueId attention_out = graph.add_node(
        OpKind::matmul, h + "attn.c_proj",
        row_split_inputs(attention, h + "attn.c_proj.weight", h + "attn.c_proj.bias"), linear)[0];
    ValueId residual1 = graph.add_node(OpKind::add, h + "residual_1", {x, leave(h + "attn.tp_reduce", attention_out)})[0];
    ValueId ln2 = graph.add_node(OpKind::layernorm, h + "ln_2",
                                 {residual1, param(h + "ln_2.weight"), param(h + "ln_2.bias")}, layernorm)[0];
    ValueId hidden = graph.add_node(OpKind::matmul, h + "mlp.c_fc",
                                    {enter(h + "mlp.tp_copy", ln2), param(h + "mlp.c_fc.weight"),
                                     param(h + "mlp.c_fc.bias")},
                                    linear_gelu)[0];
    ValueId mlp_out = graph.add_node(OpKind::matmul, h + "mlp.c_proj",
                                     row_split_inputs(hidden, h + "mlp.c_proj.weight", h + "mlp.c_proj.bias"), linear)[0];
    x = graph.add_node(OpKind::add, h + "residual_2", {residual1, leave(h + "mlp.tp_reduce", mlp_out)})[0];
  }
  if (!range.last) return x;
  return graph.add_node(OpKind::layernorm, "ln_f", {x, param("ln_f.weight"), param("ln_f.bias")}, layernorm)[0];
}

// Tied head: logits = hidden · wte^T, reading the embedding table in its [V, C] layout; profiled
// apart from the other matmuls (the largest of them, and the one decoding needs most).
ValueId add_lm_head(GptGraph& g, ValueId hidden, ValueId wte, Attributes attributes = {}) {
  return g.graph.add_node(OpKind::matmul, "lm_head", {hidden, wte},
                          attributes.set("layout", static_cast<int64_t>(WeightLayout::out_in)).set("profile_apart", 1))[0];
}

// Decoding's matmuls run no backward pass: GELU's slope is not kept.
Attributes forward_only() { return Attributes().set("forward_only", 1); }

// Serving's matmuls: decoding's, and a request's tokens must not depend on the batch it shares.
Attributes row_invariant() { return forward_only().set("row_invariant", 1); }

}  // namespace

GptGraph build_gpt_training_graph(const GptConfig& config, int64_t batch, int64_t sequence, const LayerRange& range,
                                  const TensorShard& shard) {
  GptGraph g;
  if (range.first) {
    g.tokens = g.graph.add_value("tokens", Shape{batch, sequence}, DType::i32, ValueRole::input);
  } else {
    g.stage_input = g.graph.add_value("stage_input", Shape{batch, sequence, config.n_embd}, DType::f32, ValueRole::input);
  }
  if (range.last) g.targets = g.graph.add_value("targets", Shape{batch, sequence}, DType::i32, ValueRole::input);
  ValueId hidden = add_decoder(g, config, graph::kNoValue, [&](const std::string& h, ValueId qkv, const Attributes& core) {
    return g.graph.add_node(OpKind::attention, h + "attn.core", {qkv}, core)[0];
  }, {}, range, shard);
  if (!range.last) {
    g.stage_output = hidden;
    return g;
  }
  if (shard.size == 1) {
    g.logits = add_lm_head(g, hidden, g.parameters.at("wte.weight"));
    g.losses = g.graph.add_node(OpKind::softmax_xent, "xent", {g.logits, g.targets})[0];
    return g;
  }
  // Vocabulary-parallel: each shard computes its columns of the logits, and the loss needs only
  // two all-reduces of per-row numbers: no rank holds all the logits.
  const ValueId whole_hidden = g.graph.add_node(OpKind::tp_copy, "lm_head.tp_copy", {hidden})[0];
  g.logits = add_lm_head(g, whole_hidden, g.parameters.at("wte.weight"));
  const Attributes xent =
      Attributes().set("vocab_parallel", 1).set("vocab_begin", shard.rank * (config.vocab_size / shard.size));
  g.losses = g.graph.add_node(OpKind::softmax_xent, "xent", {g.logits, g.targets}, xent)[0];
  return g;
}

GptGraph build_gpt_decode_graph(const GptConfig& config, int64_t batch, int64_t new_tokens, int64_t max_sequence) {
  GptGraph g;
  g.tokens = g.graph.add_value("tokens", Shape{batch, new_tokens}, DType::i32, ValueRole::input);
  g.position = g.graph.add_value("position", Shape{1}, DType::i32, ValueRole::input);
  const Shape cache{batch, config.n_head, max_sequence, config.n_embd / config.n_head};
  ValueId hidden = add_decoder(g, config, g.position, [&](const std::string& h, ValueId qkv, const Attributes& core) {
    ValueId keys = g.graph.add_value(h + "attn.k_cache", cache, DType::f32, ValueRole::state);
    ValueId values = g.graph.add_value(h + "attn.v_cache", cache, DType::f32, ValueRole::state);
    g.caches.push_back({keys, values});
    return g.graph.add_node(OpKind::attention_cached, h + "attn.core", {qkv, keys, values, g.position}, core)[0];
  }, forward_only());
  g.logits = add_lm_head(g, hidden, g.parameters.at("wte.weight"));
  return g;
}

GptGraph build_gpt_serving_decoder(const GptConfig& config, int64_t max_tokens, int64_t kv_blocks,
                                   int64_t block_size, DType kv_dtype) {
  GptGraph g;
  g.tokens = g.graph.add_value("tokens", Shape{max_tokens, 1}, DType::i32, ValueRole::input);
  g.position = g.graph.add_value("positions", Shape{max_tokens}, DType::i32, ValueRole::input);
  const int64_t max_blocks = (config.n_positions + block_size - 1) / block_size;
  g.block_tables = g.graph.add_value("block_tables", Shape{max_tokens, max_blocks}, DType::i32, ValueRole::input);
  const Shape pool{kv_blocks, config.n_head, block_size, config.n_embd / config.n_head};
  g.hidden = add_decoder(g, config, g.position, [&](const std::string& h, ValueId qkv, const Attributes& core) {
    ValueId keys = g.graph.add_value(h + "attn.k_pool", pool, kv_dtype, ValueRole::state);
    ValueId values = g.graph.add_value(h + "attn.v_pool", pool, kv_dtype, ValueRole::state);
    g.caches.push_back({keys, values});
    return g.graph.add_node(OpKind::attention_paged, h + "attn.core", {qkv, keys, values, g.position, g.block_tables},
                            core)[0];
  }, row_invariant());
  return g;
}

GptGraph build_gpt_serving_head(const GptConfig& config, int64_t max_rows, DType hidden) {
  GptGraph g;
  g.hidden = g.graph.add_value("hidden", Shape{max_rows, 1, config.n_embd}, hidden, ValueRole::input);
  const ValueId wte = g.graph.add_value("wte.weight", Shape{config.vocab_size, config.n_embd}, DType::f32,
                                        ValueRole::parameter);
  g.parameters["wte.weight"] = wte;
  g.logits = add_lm_head(g, g.hidden, wte, row_invariant());
  return g;
}

namespace {

// Stores those of `values` (name -> value) that only in_out matmuls read as [out, in], then
// interleaves or tiles those of the [out, in] weights (and embedding tables, interleaved only)
// the backend prefers so; returns their names.
StoredLayouts lay_out_for_decoding(graph::Graph& graph, const std::map<std::string, graph::ValueId>& values,
                                   const Backend& backend) {
  std::vector<graph::ValueId> ids;
  for (const auto& [name, id] : values) ids.push_back(id);
  auto names = [&](const std::vector<graph::ValueId>& changed) {
    std::set<std::string> result;
    for (graph::ValueId id : changed) {
      for (const auto& [name, value] : values) {
        if (value == id) result.insert(name);
      }
    }
    return result;
  };
  StoredLayouts layouts;
  layouts.transposed = names(graph::transpose_matmul_weights(graph, ids));
  layouts.interleaved = names(graph::interleave_weights(graph, ids, backend));
  layouts.tiled = names(graph::tile_weights(graph, ids, backend));
  return layouts;
}

// Whether `backend` can decode with weights in `weights` (float32 always; bfloat16 needs its bf16
// matmul; float16 the f32 matmul, which reads float16 weights); fails naming what is missing.
void check_decoding_weights(const Backend& backend, DType weights) {
  check(weights == DType::f32 || weights == DType::bf16 || weights == DType::f16,
        "decoding weights must be float32, bfloat16 or float16 (got {})", dtype_name(weights));
  const DType matmul = weights == DType::bf16 ? DType::bf16 : DType::f32;  // f32 rows read float16 weights
  check(weights == DType::f32 || backend.supports(KernelOp::matmul_forward, matmul),
        "{} weights: backend '{}' has no {} matmul (float32 always works)", dtype_name(weights), backend.name(),
        dtype_name(matmul));
}

}  // namespace

StoredLayouts use_weights_for_decoding(GptGraph& g, Backend& backend, DType weights) {
  check_decoding_weights(backend, weights);
  if (weights == DType::f32) return lay_out_for_decoding(g.graph, g.parameters, backend);
  if (weights == DType::f16) {
    name_half_parameters(g, graph::read_matmul_weights_in(g.graph, DType::f16));
  } else {
    std::set<graph::ValueId> keep_f32;
    if (g.logits != graph::kNoValue) keep_f32.insert(g.logits);
    name_half_parameters(g, graph::apply_precision_policy(g.graph, graph::PrecisionPolicy::mixed_bfloat16,
                                                          graph::GraphUse::inference, keep_f32, backend));
  }
  return lay_out_for_decoding(g.graph, g.half_parameters, backend);
}

void name_half_parameters(GptGraph& g, const graph::PrecisionPlan& plan) {
  for (const auto& [parameter, copy] : plan.half_parameters) {
    for (const auto& [name, id] : g.parameters) {
      if (id == parameter) g.half_parameters[name] = copy;
    }
  }
}

ParameterSet make_half_parameters(const GptGraph& g, const ParameterSet& parameters, Backend& backend, DType dtype) {
  if (g.half_parameters.empty()) return {};
  return parameters.converted_copy(backend, dtype, {});
}

void bind_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                     const ParameterSet* gradients, const ParameterSet* half_parameters) {
  auto bind = [&](const std::map<std::string, graph::ValueId>& values, const ParameterSet& source) {
    for (const auto& [name, id] : values) {
      executor.bind(id, source.get(name));
      graph::ValueId grad = graph.graph.value(id).grad;
      if (gradients != nullptr && grad != graph::kNoValue) executor.bind(grad, gradients->get(name));
    }
  };
  bind(graph.parameters, parameters);
  if (graph.half_parameters.empty()) return;
  check(half_parameters != nullptr, "the graph reads 16-bit parameter copies but none were given to bind");
  bind(graph.half_parameters, *half_parameters);
}

}  // namespace paraflow::model
