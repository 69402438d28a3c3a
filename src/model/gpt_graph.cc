#include "model/gpt_graph.h"

#include <algorithm>
#include <functional>

#include "graph/executor.h"
#include "graph/weight_layout.h"

namespace paraflow::model {

using graph::Attributes;
using graph::OpKind;
using graph::ValueId;
using graph::ValueRole;

namespace {

// One block's attention core, given its (rotated) qkv value and the core's attributes (n_head,
// n_kv_head and the layer's score scale): the training graph's attention, decoding's over a KV
// cache, serving's over a paged one.
using AttentionCore = std::function<ValueId(const std::string& prefix, ValueId qkv, const Attributes& core)>;

// What a block's ops are built from: the graph and its parameters, the attributes every matmul of
// the stack shares (decoding's forward_only, serving's row_invariant), and a tensor-parallel
// `shard`'s way into and out of its region (identities without tensor parallelism).
struct BlockContext {
  GptGraph& g;
  const GptConfig& config;
  const TensorShard& shard;
  const AttentionCore& attention_core;
  ValueId position;  // decoding's positions (rotary embeddings), or kNoValue
  Attributes linear;

  ValueId param(const std::string& name) const { return g.parameters.at(name); }
  bool has(const std::string& name) const { return g.parameters.count(name) != 0; }
  ValueId node(OpKind kind, const std::string& name, std::vector<ValueId> inputs, Attributes attributes = {}) const {
    return g.graph.add_node(kind, name, std::move(inputs), std::move(attributes))[0];
  }
  ValueId enter(const std::string& name, ValueId x) const {
    return shard.size > 1 ? node(OpKind::tp_copy, name, {x}) : x;
  }
  ValueId leave(const std::string& name, ValueId x) const {
    return shard.size > 1 ? node(OpKind::tp_reduce, name, {x}) : x;
  }
  // x · weight (+ bias when the model has it), the weight in `layout`, then GELU if asked.
  ValueId linear_layer(const std::string& name, ValueId x, WeightLayout layout, bool gelu = false) const {
    std::vector<ValueId> inputs{x, param(name + ".weight")};
    if (has(name + ".bias")) inputs.push_back(param(name + ".bias"));
    Attributes attributes = linear;
    attributes.set("layout", static_cast<int64_t>(layout));
    if (gelu) attributes.set("gelu", 1);
    return node(OpKind::matmul, name, std::move(inputs), attributes);
  }
  // A row-split layer (its input and weight split, tensor-parallel): the shards add partial
  // products, so shard 0 alone adds the bias.
  ValueId row_split_layer(const std::string& name, ValueId x, WeightLayout layout) const {
    std::vector<ValueId> inputs{x, param(name + ".weight")};
    if (shard.rank == 0 && has(name + ".bias")) inputs.push_back(param(name + ".bias"));
    Attributes attributes = linear;
    return node(OpKind::matmul, name, std::move(inputs), attributes.set("layout", static_cast<int64_t>(layout)));
  }
  // The shard's q heads, and its k/v heads: its share, or the one its q heads read when there
  // are fewer k/v heads than shards (replicated).
  int64_t q_heads() const { return config.n_head / shard.size; }
  int64_t kv_heads() const { return std::max<int64_t>(config.kv_heads() / shard.size, 1); }
  Attributes attention_attributes(int64_t layer) const {
    return Attributes()
        .set("n_head", q_heads())
        .set("n_kv_head", kv_heads())
        .set_float("scale", config.attention_scale(layer));
  }
};

// GPT-2's block: x + attn(ln_1(x)), then + mlp(ln_2(.)) with a GELU MLP; a tensor-parallel shard
// runs its heads and its part of the MLP between tp_copy and tp_reduce.
ValueId add_gpt2_block(const BlockContext& b, int64_t layer, ValueId x) {
  const std::string h = b.config.block_prefix() + std::to_string(layer) + ".";
  const Attributes layernorm = Attributes().set_float("eps", b.config.layer_norm_epsilon);
  constexpr WeightLayout in_out = WeightLayout::in_out;
  ValueId ln1 = b.node(OpKind::layernorm, h + "ln_1", {x, b.param(h + "ln_1.weight"), b.param(h + "ln_1.bias")}, layernorm);
  ValueId qkv = b.linear_layer(h + "attn.c_attn", b.enter(h + "attn.tp_copy", ln1), in_out);
  ValueId attention = b.attention_core(h, qkv, b.attention_attributes(layer));
  ValueId residual1 = b.node(OpKind::add, h + "residual_1",
                             {x, b.leave(h + "attn.tp_reduce", b.row_split_layer(h + "attn.c_proj", attention, in_out))});
  ValueId ln2 = b.node(OpKind::layernorm, h + "ln_2",
                       {residual1, b.param(h + "ln_2.weight"), b.param(h + "ln_2.bias")}, layernorm);
  ValueId hidden = b.linear_layer(h + "mlp.c_fc", b.enter(h + "mlp.tp_copy", ln2), in_out, true);
  return b.node(OpKind::add, h + "residual_2",
                {residual1, b.leave(h + "mlp.tp_reduce", b.row_split_layer(h + "mlp.c_proj", hidden, in_out))});
}

// The Llama family's block: x + o_proj(attention(rope(qkv_proj(rmsnorm(x))))), then
// + down_proj(silu(gate_proj(.)) * up_proj(.)) of rmsnorm of that; nn.Linear weights [out, in].
// A tensor-parallel shard runs its heads and its part of the MLP between tp_copy and tp_reduce.
ValueId add_llama_block(const BlockContext& b, int64_t layer, ValueId x) {
  const std::string h = b.config.block_prefix() + std::to_string(layer) + ".";
  const Attributes rmsnorm = Attributes().set_float("eps", b.config.layer_norm_epsilon);
  const RopeFrequencies& rope = b.config.rope;
  const Attributes rotary = Attributes()
                                .set("n_head", b.q_heads())
                                .set("n_kv_head", b.kv_heads())
                                .set_float("rope_theta", rope.theta)
                                .set("rope_scaling", static_cast<int64_t>(rope.scaling))
                                .set_float("rope_factor", rope.factor)
                                .set_float("rope_low_freq_factor", rope.low_freq_factor)
                                .set_float("rope_high_freq_factor", rope.high_freq_factor)
                                .set_float("rope_original_max_position", rope.original_max_position);
  constexpr WeightLayout linear = WeightLayout::out_in;
  ValueId norm1 = b.node(OpKind::rmsnorm, h + "input_layernorm", {x, b.param(h + "input_layernorm.weight")}, rmsnorm);
  ValueId qkv = b.linear_layer(h + "self_attn.qkv_proj", b.enter(h + "self_attn.tp_copy", norm1), linear);
  std::vector<ValueId> rope_inputs{qkv};
  if (b.position != graph::kNoValue) rope_inputs.push_back(b.position);
  ValueId rotated = b.node(OpKind::rope, h + "self_attn.rope", rope_inputs, rotary);
  ValueId attention = b.attention_core(h + "self_attn.", rotated, b.attention_attributes(layer));
  ValueId attention_out = b.row_split_layer(h + "self_attn.o_proj", attention, linear);
  ValueId residual1 = b.node(OpKind::add, h + "residual_1", {x, b.leave(h + "self_attn.tp_reduce", attention_out)});
  ValueId norm2 = b.node(OpKind::rmsnorm, h + "post_attention_layernorm",
                         {residual1, b.param(h + "post_attention_layernorm.weight")}, rmsnorm);
  const ValueId mlp_input = b.enter(h + "mlp.tp_copy", norm2);
  ValueId gated = b.node(OpKind::swiglu, h + "mlp.act", {b.linear_layer(h + "mlp.gate_proj", mlp_input, linear),
                                                         b.linear_layer(h + "mlp.up_proj", mlp_input, linear)});
  return b.node(OpKind::add, h + "residual_2",
                {residual1, b.leave(h + "mlp.tp_reduce", b.row_split_layer(h + "mlp.down_proj", gated, linear))});
}

// The decoder stack shared by every graph: the embedding, n_layer blocks of the config's
// architecture and the final norm — or, for a pipeline stage, the blocks of `range`, starting
// from g.stage_input unless it is the first stage and returning the residual stream unless it is
// the last. `position`: decoding's positions input, or kNoValue (training: 0..T-1).
ValueId add_decoder(GptGraph& g, const GptConfig& config, ValueId position, const AttentionCore& attention_core,
                    Attributes linear = {}, const LayerRange& range = {}, const TensorShard& shard = {}) {
  graph::Graph& graph = g.graph;
  check(config.n_head % shard.size == 0, "dist.tensor_parallel ({}) must divide model.n_head ({})", shard.size,
        config.n_head);
  // An untied head's weight is the head's (head_weight), not the stack's.
  for (const TensorSpec& spec : part_tensor_specs(gpt_tensor_specs(config), range, shard)) {
    if (spec.name == "lm_head.weight") continue;
    g.parameters[spec.name] = graph.add_value(spec.name, spec.shape, DType::f32, ValueRole::parameter);
  }
  const BlockContext block{g, config, shard, attention_core, position, linear};
  ValueId x = g.stage_input;
  if (range.first) {
    std::vector<ValueId> embed_inputs{g.tokens, block.param(embedding_table_name(config))};
    if (!config.is_llama()) embed_inputs.push_back(block.param("wpe.weight"));
    if (position != graph::kNoValue && !config.is_llama()) embed_inputs.push_back(position);
    // Vocabulary-parallel: each shard looks up its rows of wte, shard 0 adds the positions.
    Attributes embed = Attributes()
                           .set("vocab_begin", shard.rank * (config.vocab_size / shard.size))
                           .set("add_positions", shard.rank == 0 ? 1 : 0);
    x = block.leave("embed.tp_reduce", block.node(OpKind::embedding, "embed", embed_inputs, embed));
  }
  for (int64_t layer = range.first_layer; layer < config.n_layer && range.holds_layer(layer); ++layer) {
    x = config.is_llama() ? add_llama_block(block, layer, x) : add_gpt2_block(block, layer, x);
  }
  if (!range.last) return x;
  if (config.is_llama()) {
    return block.node(OpKind::rmsnorm, "model.norm", {x, block.param("model.norm.weight")},
                      Attributes().set_float("eps", config.layer_norm_epsilon));
  }
  return block.node(OpKind::layernorm, "ln_f", {x, block.param("ln_f.weight"), block.param("ln_f.bias")},
                    Attributes().set_float("eps", config.layer_norm_epsilon));
}

// The head's [vocab, n_embd] weight (a shard's: its vocabulary rows): the embedding table when
// tied, else lm_head.weight (added).
ValueId head_weight(GptGraph& g, const GptConfig& config, const TensorShard& shard = {}) {
  const std::string name = lm_head_name(config);
  if (!g.parameters.count(name)) {
    g.parameters[name] = g.graph.add_value(name, Shape{config.vocab_size / shard.size, config.n_embd}, DType::f32,
                                           ValueRole::parameter);
  }
  return g.parameters.at(name);
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
  if (config.is_llama()) config.check_sequence_length(sequence, "the training sequence length");
  ValueId hidden = add_decoder(g, config, graph::kNoValue, [&](const std::string& h, ValueId qkv, const Attributes& core) {
    return g.graph.add_node(OpKind::attention, h + "attn.core", {qkv}, core)[0];
  }, {}, range, shard);
  if (!range.last) {
    g.stage_output = hidden;
    return g;
  }
  if (shard.size == 1) {
    g.logits = add_lm_head(g, hidden, head_weight(g, config));
    g.losses = g.graph.add_node(OpKind::softmax_xent, "xent", {g.logits, g.targets})[0];
    return g;
  }
  // Vocabulary-parallel: each shard computes its columns of the logits, and the loss needs only
  // two all-reduces of per-row numbers: no rank holds all the logits.
  const ValueId whole_hidden = g.graph.add_node(OpKind::tp_copy, "lm_head.tp_copy", {hidden})[0];
  g.logits = add_lm_head(g, whole_hidden, head_weight(g, config, shard));
  const Attributes xent =
      Attributes().set("vocab_parallel", 1).set("vocab_begin", shard.rank * (config.vocab_size / shard.size));
  g.losses = g.graph.add_node(OpKind::softmax_xent, "xent", {g.logits, g.targets}, xent)[0];
  return g;
}

GptGraph build_gpt_decode_graph(const GptConfig& config, int64_t batch, int64_t new_tokens, int64_t max_sequence) {
  if (config.is_llama()) config.check_sequence_length(max_sequence, "the decoding context");
  GptGraph g;
  g.tokens = g.graph.add_value("tokens", Shape{batch, new_tokens}, DType::i32, ValueRole::input);
  g.position = g.graph.add_value("position", Shape{1}, DType::i32, ValueRole::input);
  const Shape cache{batch, config.kv_heads(), max_sequence, config.head_size()};
  ValueId hidden = add_decoder(g, config, g.position, [&](const std::string& h, ValueId qkv, const Attributes& core) {
    ValueId keys = g.graph.add_value(h + "attn.k_cache", cache, DType::f32, ValueRole::state);
    ValueId values = g.graph.add_value(h + "attn.v_cache", cache, DType::f32, ValueRole::state);
    g.caches.push_back({keys, values});
    return g.graph.add_node(OpKind::attention_cached, h + "attn.core", {qkv, keys, values, g.position}, core)[0];
  }, forward_only());
  g.logits = add_lm_head(g, hidden, head_weight(g, config));
  return g;
}

GptGraph build_gpt_serving_decoder(const GptConfig& config, int64_t max_tokens, int64_t kv_blocks,
                                   int64_t block_size, DType kv_dtype) {
  // A sequence may grow to the model's whole context.
  if (config.is_llama()) config.check_sequence_length(config.n_positions, "the serving context (max_position_embeddings)");
  GptGraph g;
  g.tokens = g.graph.add_value("tokens", Shape{max_tokens, 1}, DType::i32, ValueRole::input);
  g.position = g.graph.add_value("positions", Shape{max_tokens}, DType::i32, ValueRole::input);
  const int64_t max_blocks = (config.n_positions + block_size - 1) / block_size;
  g.block_tables = g.graph.add_value("block_tables", Shape{max_tokens, max_blocks}, DType::i32, ValueRole::input);
  const Shape pool{kv_blocks, config.kv_heads(), block_size, config.head_size()};
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
  g.logits = add_lm_head(g, g.hidden, head_weight(g, config), row_invariant());
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
// matmul; float16 the f32 matmul, which reads float16 weights; q8_0 and q4_k their own matmul);
// fails naming what is missing.
void check_decoding_weights(const Backend& backend, DType weights) {
  check(weights == DType::f32 || weights == DType::bf16 || weights == DType::f16 || is_block_quantized(weights),
        "decoding weights must be float32, bfloat16, float16, q8_0 or q4_k (got {})", dtype_name(weights));
  const DType matmul = weights == DType::f16 ? DType::f32 : weights;  // f32 rows read float16 weights
  check(weights == DType::f32 || backend.supports(KernelOp::matmul_forward, matmul),
        "{} weights: backend '{}' has no {} matmul (float32 always works)", dtype_name(weights), backend.name(),
        dtype_name(matmul));
}

}  // namespace

namespace {

// The embedding reads the token table where `parameters`' file holds it, where it does and the
// backend's embedding reads the file's type (use_weights_for_decoding).
void read_table_as_stored(GptGraph& g, const ParameterSet& parameters, const Backend& backend) {
  for (const auto& [name, table] : g.parameters) {
    const std::optional<Tensor> stored = parameters.stored_rows(name);
    if (!stored || !backend.supports(KernelOp::embedding_forward, stored->dtype())) continue;
    graph::ValueId as_stored = graph::kNoValue;
    for (int32_t n : g.graph.schedule()) {
      const graph::Node& node = g.graph.nodes()[static_cast<size_t>(n)];
      if (node.kind != graph::OpKind::embedding || node.is_backward || node.inputs[1] != table) continue;
      if (as_stored == graph::kNoValue) {
        const graph::Value& value = g.graph.value(table);
        as_stored = g.graph.add_value(value.name + ".stored", value.shape, stored->dtype(), graph::ValueRole::parameter);
      }
      g.graph.replace_input(n, table, as_stored);
    }
    if (as_stored != graph::kNoValue) g.stored_tables[name] = as_stored;
  }
}

}  // namespace

StoredLayouts use_weights_for_decoding(GptGraph& g, Backend& backend, DType weights, const ParameterSet* parameters) {
  check_decoding_weights(backend, weights);
  if (weights == DType::f32) return lay_out_for_decoding(g.graph, g.parameters, backend);
  if (parameters != nullptr) read_table_as_stored(g, *parameters, backend);
  if (weights == DType::f16 || is_block_quantized(weights)) {
    name_half_parameters(g, graph::read_matmul_weights_in(g.graph, weights));
  } else {
    std::set<graph::ValueId> keep_f32;
    if (g.logits != graph::kNoValue) keep_f32.insert(g.logits);
    name_half_parameters(g, graph::apply_precision_policy(g.graph, graph::PrecisionPolicy::mixed_bfloat16,
                                                          graph::GraphUse::inference, keep_f32, backend));
  }
  // A weight now read only through its copy (or, a table, where its file holds it) is no f32
  // parameter of this graph, so nothing binds its f32 values and a file's are never read in.
  std::set<graph::ValueId> read;
  for (const graph::Node& node : g.graph.nodes()) read.insert(node.inputs.begin(), node.inputs.end());
  std::erase_if(g.parameters, [&](const auto& parameter) { return read.count(parameter.second) == 0; });
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

std::set<std::string> half_parameter_names(const GptGraph& g) {
  std::set<std::string> names;
  for (const auto& [name, id] : g.half_parameters) names.insert(name);
  return names;
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

ParameterSet decoding_copy(const ParameterSet& parameters, Backend& backend, DType weights,
                           const StoredLayouts& layouts, const std::set<std::string>& half_names) {
  const std::set<std::string> copied = weights == DType::f32 ? layouts.names() : half_names;
  return parameters.converted_copy(backend, weights, layouts, &copied);
}

void bind_decoding_parameters(graph::Executor& executor, const GptGraph& graph, const ParameterSet& parameters,
                              const ParameterSet& copy) {
  for (const auto& [name, id] : graph.stored_tables) executor.bind(id, *parameters.stored_rows(name));
  if (!graph.half_parameters.empty()) {  // the copy holds the 16-bit or quantized weights, read beside the f32 ones
    bind_parameters(executor, graph, parameters, nullptr, &copy);
    return;
  }
  for (const auto& [name, id] : graph.parameters) executor.bind(id, (copy.contains(name) ? copy : parameters).get(name));
}

}  // namespace paraflow::model
