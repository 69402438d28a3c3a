// The shapes of the partitioned training graphs: a pipeline stage's boundary values, and a
// tensor-parallel shard's split weights, its tp_copy / tp_reduce pairs and its slice of the
// vocabulary (no rank holds all the logits), and Llama's k/v heads replicated over shards. Then the decoding graphs' weight layouts, and the
// parameter copy stored in them.
#include "model/gpt_graph.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "expect_error.h"
#include "model_configs.h"

namespace paraflow::model {
namespace {

GptConfig small_config() {
  GptConfig config;
  config.vocab_size = 256;
  config.n_positions = 16;
  config.n_embd = 32;
  config.n_layer = 3;
  config.n_head = 4;
  return config;
}

int count_nodes(const GptGraph& g, graph::OpKind kind) {
  int count = 0;
  for (const graph::Node& node : g.graph.nodes()) count += node.kind == kind;
  return count;
}

TEST(GptGraph, AMiddleStageStartsAndEndsWithTheResidualStream) {
  const GptGraph g = build_gpt_training_graph(small_config(), 2, 16, LayerRange{1, 2, false, false});
  EXPECT_EQ(g.tokens, graph::kNoValue);
  EXPECT_EQ(g.targets, graph::kNoValue);
  EXPECT_EQ(g.logits, graph::kNoValue);
  EXPECT_EQ(g.graph.value(g.stage_input).shape, (Shape{2, 16, 32}));
  EXPECT_EQ(g.graph.value(g.stage_output).shape, (Shape{2, 16, 32}));
  // Block 1's tensors only.
  EXPECT_EQ(g.parameters.size(), 12u);
  EXPECT_TRUE(g.parameters.count("h.1.attn.c_attn.weight"));
  EXPECT_EQ(count_nodes(g, graph::OpKind::embedding), 0);
}

TEST(GptGraph, ATensorParallelShardHoldsItsColumnsRowsAndVocabulary) {
  const GptConfig config = small_config();
  const GptGraph g = build_gpt_training_graph(config, 2, 16, {}, TensorShard{1, 2});
  auto shape = [&](const std::string& name) { return g.graph.value(g.parameters.at(name)).shape; };
  EXPECT_EQ(shape("h.0.attn.c_attn.weight"), (Shape{32, 48}));
  EXPECT_EQ(shape("h.0.attn.c_proj.weight"), (Shape{16, 32}));
  EXPECT_EQ(shape("h.0.mlp.c_fc.weight"), (Shape{32, 64}));
  EXPECT_EQ(shape("h.0.mlp.c_proj.weight"), (Shape{64, 32}));
  EXPECT_EQ(shape("wte.weight"), (Shape{128, 32}));
  EXPECT_EQ(shape("wpe.weight"), (Shape{16, 32}));
  EXPECT_EQ(g.graph.value(g.logits).shape, (Shape{2, 16, 128}));
  // Per block: one region for attention, one for the MLP; one for the embedding, one for the head.
  EXPECT_EQ(count_nodes(g, graph::OpKind::tp_copy), 2 * 3 + 1);
  EXPECT_EQ(count_nodes(g, graph::OpKind::tp_reduce), 2 * 3 + 1);
  // Shard 1 adds no bias after a row-split matmul (shard 0 does).
  for (const graph::Node& node : g.graph.nodes()) {
    if (node.name == "h.0.attn.c_proj") {
      EXPECT_EQ(node.inputs.size(), 2u);
    }
  }
}

const TensorSpec& spec_named(const std::vector<TensorSpec>& specs, const std::string& name) {
  for (const TensorSpec& spec : specs) {
    if (spec.name == name) return spec;
  }
  throw std::runtime_error("no tensor " + name);
}

TEST(GptGraph, AShardHoldsBoxesOfTheWholeTensor) {
  // GPT-2, C 4 in 2 heads of 2: c_attn [4, 12] (q, k, v sections of 4 columns), shard 1 of 2:
  // columns 2-3 of each section, held as columns 0-1, 2-3 and 4-5 of the shard's [4, 6].
  const std::vector<TensorSpec> specs = gpt_tensor_specs(testing::gpt_config(8, 4, 4, 1, 2));
  const auto placements = shard_slices(spec_named(specs, "h.0.attn.c_attn.weight"), TensorShard{1, 2});
  ASSERT_EQ(placements.size(), 3u);
  for (int64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(placements[s].global, (TensorSlice{{0, 4 * s + 2}, {4, 2}}));
    EXPECT_EQ(placements[s].local, (TensorSlice{{0, 2 * s}, {4, 2}}));
    EXPECT_TRUE(placements[s].first_holder);
  }
  // c_proj [4, 4], its rows by heads, shard 1 of 2: rows 2 and 3, the shard's rows 0 and 1.
  const auto rows = shard_slices(spec_named(specs, "h.0.attn.c_proj.weight"), TensorShard{1, 2});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].global, (TensorSlice{{2, 0}, {2, 4}}));
  EXPECT_EQ(rows[0].local, (TensorSlice{{0, 0}, {2, 4}}));
  // A layernorm is whole on every shard; shard 0 writes it.
  const TensorSpec& norm = spec_named(specs, "h.0.ln_1.weight");
  EXPECT_EQ(shard_slices(norm, TensorShard{1, 2})[0].global, TensorSlice::whole(Shape{4}));
  EXPECT_FALSE(shard_slices(norm, TensorShard{1, 2})[0].first_holder);
  EXPECT_TRUE(shard_slices(norm, TensorShard{0, 2})[0].first_holder);
}

// Llama, 4 q heads and 1 k/v head of 2: qkv_proj [12, 4] by rows, q rows 0-7, k 8-9, v 10-11.
// With 2 shards each holds 2 q heads and the k/v head, whose gradient is then partial (summed
// over both) and counted in a norm by shard 0 alone.
TEST(GptGraph, KeyValueHeadsFewerThanTheShardsAreReplicated) {
  const model::GptConfig config = testing::llama_config("llama", 8, 8, 4, 4, 1, 4, 1, 2);
  const std::vector<TensorSpec> llama_specs = gpt_tensor_specs(config);
  const TensorSpec& qkv = spec_named(llama_specs, "model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(shard_tensor_specs({qkv}, TensorShard{1, 2})[0].shape, (Shape{8, 4}));
  // Shard 1: q rows 4-7, then the k and v heads (rows 8-9, 10-11), which shard 0 writes.
  const auto held = shard_slices(qkv, TensorShard{1, 2});
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held[0].global, (TensorSlice{{4, 0}, {4, 4}}));
  EXPECT_TRUE(held[0].first_holder);
  EXPECT_EQ(held[1].global, (TensorSlice{{8, 0}, {2, 4}}));
  EXPECT_EQ(held[1].local, (TensorSlice{{4, 0}, {2, 4}}));
  EXPECT_EQ(held[2].global, (TensorSlice{{10, 0}, {2, 4}}));
  EXPECT_FALSE(held[1].first_holder || held[2].first_holder);
  EXPECT_TRUE(shard_slices(qkv, TensorShard{0, 2})[1].first_holder);
  const std::vector<ShardRun> partial = partial_gradient_runs(qkv, TensorShard{1, 2});
  ASSERT_EQ(partial.size(), 1u);
  EXPECT_EQ(partial[0].in_shard, 16);  // after its 16 q elements
  EXPECT_EQ(partial[0].in_whole, 32);
  EXPECT_EQ(partial[0].count, 16);
  int64_t counted = 0;
  for (int rank = 0; rank < 2; ++rank) {
    for (const auto& [at, count] : counted_runs(qkv, TensorShard{rank, 2})) counted += count;
  }
  EXPECT_EQ(counted, whole_numel(qkv)) << "every element counted once";
  EXPECT_EQ(counted_runs(qkv, TensorShard{1, 2}), (std::vector<std::pair<int64_t, int64_t>>{{0, 16}}));
  // 4 shards: one q head each (shard 3: rows 6-7), the k/v head on all of them.
  const auto fourth = shard_slices(qkv, TensorShard{3, 4});
  EXPECT_EQ(fourth[0].global, (TensorSlice{{6, 0}, {2, 4}}));
  EXPECT_EQ(fourth[1].global, (TensorSlice{{8, 0}, {2, 4}}));
  EXPECT_EQ(fourth[1].local, (TensorSlice{{2, 0}, {2, 4}}));
  // As many k/v heads as shards: split, nothing partial; the row-split o_proj's bias is.
  model::GptConfig split = testing::llama_config("llama", 8, 8, 4, 4, 1, 4, 2, 2);
  split.attention_bias = true;
  const std::vector<TensorSpec> specs = gpt_tensor_specs(split);
  EXPECT_TRUE(partial_gradient_runs(spec_named(specs, "model.layers.0.self_attn.qkv_proj.weight"), {1, 2}).empty());
  EXPECT_EQ(partial_gradient_runs(spec_named(specs, "model.layers.0.self_attn.o_proj.bias"), {1, 2}).size(), 1u);
  // 3 k/v heads neither divide 2 shards nor share them.
  model::GptConfig three = testing::llama_config("llama", 8, 8, 6, 4, 1, 6, 3, 2);
  testing::expect_error<InputError>([&] { shard_tensor_specs(gpt_tensor_specs(three), TensorShard{0, 2}); },
                                    {"dist.tensor_parallel (2) and model.n_kv_head (3): one must divide the other"});
}

// Serving's f32 decoder: every linear weight stored [out, in], and interleaved where the CPU's
// kernel prefers it, wte too (the embedding reads it interleaved, for the head's sake). The copy
// puts each element where the layouts say.
TEST(GptGraph, ServingWeightsAreStoredInTheLayoutsTheirKernelsRead) {
  const GptConfig config = small_config();
  GptGraph g = build_gpt_serving_decoder(config, 8, 4, 16);
  const StoredLayouts layouts = use_weights_for_decoding(g, cpu_backend(), DType::f32);
  std::set<std::string> linear;
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    for (const char* name : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      linear.insert(fmt::format("h.{}.{}.weight", layer, name));
    }
  }
  EXPECT_EQ(layouts.transposed, linear);
  const bool prefers = cpu_backend().prefers_interleaved_weights(DType::f32);
  std::set<std::string> interleaved = linear;
  interleaved.insert("wte.weight");
  EXPECT_EQ(layouts.interleaved, prefers ? interleaved : std::set<std::string>{});

  ParameterSet parameters(gpt_tensor_specs(config), cpu_backend());
  float* values = parameters.flat().data<float>();
  for (int64_t i = 0; i < parameters.numel(); ++i) values[i] = static_cast<float>(i % 1000) - 500.0f;
  const ParameterSet copy = parameters.converted_copy(cpu_backend(), DType::f32, layouts);
  const Tensor &source = parameters.get("h.1.mlp.c_fc.weight"), &stored = copy.get("h.1.mlp.c_fc.weight");
  const int64_t C = config.n_embd, OC = 4 * config.n_embd;
  ASSERT_EQ(stored.shape(), (Shape{OC, C}));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t o = 0; o < OC; ++o) {
      const int64_t at = prefers ? interleaved_offset(o, c, OC, C) : o * C + c;
      ASSERT_EQ(stored.data<float>()[at], source.data<float>()[c * OC + o]) << "column " << c << " output " << o;
    }
  }
  EXPECT_EQ(copy.get("wte.weight").shape(), (Shape{config.vocab_size, C}));
}

// The generator's graphs interleave the linear layers' weights and the head's where the CPU's
// kernel prefers that for their dtype: in f32 wte, which the embedding reads too, in bf16 the
// head's own 16-bit copy of it.
TEST(GptGraph, GeneratorWeightsInterleaveWhereTheKernelPrefersIt) {
  const GptConfig config = small_config();
  GptGraph f32 = build_gpt_decode_graph(config, 1, 1, config.n_positions);
  const StoredLayouts f32_layouts = use_weights_for_decoding(f32, cpu_backend(), DType::f32);
  const bool f32_prefers = cpu_backend().prefers_interleaved_weights(DType::f32);
  EXPECT_EQ(f32_layouts.interleaved.size(), f32_prefers ? 4 * config.n_layer + 1 : 0);
  EXPECT_EQ(f32_layouts.interleaved.count("wte.weight"), f32_prefers ? 1 : 0);

  GptGraph bf16 = build_gpt_decode_graph(config, 1, 1, config.n_positions);
  const StoredLayouts layouts = use_weights_for_decoding(bf16, cpu_backend(), DType::bf16);
  if (cpu_backend().prefers_interleaved_weights(DType::bf16)) {
    EXPECT_EQ(layouts.interleaved.size(), 4 * config.n_layer + 1);
    EXPECT_EQ(layouts.interleaved.count("wte.weight"), 1);
  } else {
    EXPECT_TRUE(layouts.interleaved.empty());
  }
  // On AMX they are tiled instead (every width here a multiple of 32).
  EXPECT_EQ(layouts.tiled.size(), cpu_backend().prefers_tiled_weights(DType::bf16) ? 4 * config.n_layer + 1 : 0);
  EXPECT_EQ(layouts.tiled.count("wte.weight"), cpu_backend().prefers_tiled_weights(DType::bf16) ? 1 : 0);
}

// float16 decoding weights: every matmul (the four linear layers of each block and the tied head)
// reads a float16 copy of its weight, stored [out, in]: out_in_tiles where the backend prefers
// that for float16 (its half products), else out_in_interleaved where it prefers that (f32 panels
// widening the halves); every activation stays f32 and the embedding reads the f32 wte.
TEST(GptGraph, Float16DecodingReadsHalfCopiesOfTheMatmulWeightsOnly) {
  const GptConfig config = small_config();
  GptGraph g = build_gpt_decode_graph(config, 1, 1, config.n_positions);
  const StoredLayouts layouts = use_weights_for_decoding(g, cpu_backend(), DType::f16);
  std::set<std::string> linear, copied;
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    for (const char* name : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      linear.insert(fmt::format("h.{}.{}.weight", layer, name));
    }
  }
  for (const auto& [name, id] : g.half_parameters) {
    copied.insert(name);
    EXPECT_EQ(g.graph.value(id).dtype, DType::f16) << name;
  }
  std::set<std::string> expected = linear;
  expected.insert("wte.weight");
  EXPECT_EQ(copied, expected);
  EXPECT_EQ(layouts.transposed, linear);
  const std::set<std::string> none;
  EXPECT_EQ(layouts.interleaved, cpu_backend().prefers_interleaved_weights(DType::f16) ? expected : none);
  EXPECT_EQ(layouts.tiled, cpu_backend().prefers_tiled_weights(DType::f16) ? expected : none);
  for (const graph::Value& value : g.graph.values()) {
    if (value.role != graph::ValueRole::parameter) {
      EXPECT_NE(value.dtype, DType::f16) << value.name;
    }
  }
}

// A tiled weight's copy puts each bf16 value where tiles_offset says: a linear layer's,
// transposed first, and the head's [vocab, C] table.
TEST(GptGraph, TiledWeightsAreCopiedWhereTheTilesOffsetSays) {
  const GptConfig config = small_config();
  ParameterSet parameters(gpt_tensor_specs(config), cpu_backend());
  float* values = parameters.flat().data<float>();
  for (int64_t i = 0; i < parameters.numel(); ++i) values[i] = static_cast<float>(i % 251) - 125.0f;  // exact in bf16
  StoredLayouts layouts;
  layouts.transposed = {"h.1.mlp.c_fc.weight"};
  layouts.tiled = {"h.1.mlp.c_fc.weight", "wte.weight"};
  const ParameterSet copy = parameters.converted_copy(cpu_backend(), DType::bf16, layouts);
  const int64_t C = config.n_embd, OC = 4 * config.n_embd, V = config.vocab_size;
  const float* fc = parameters.get("h.1.mlp.c_fc.weight").data<float>();
  const uint16_t* fc_stored = copy.get("h.1.mlp.c_fc.weight").data<uint16_t>();
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t o = 0; o < OC; ++o) {
      ASSERT_EQ(bf16_to_f32(fc_stored[tiles_offset(o, c, OC, C)]), fc[c * OC + o]) << "column " << c << " output " << o;
    }
  }
  const float* wte = parameters.get("wte.weight").data<float>();
  const uint16_t* wte_stored = copy.get("wte.weight").data<uint16_t>();
  for (int64_t token = 0; token < V; ++token) {
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(bf16_to_f32(wte_stored[tiles_offset(token, c, V, C)]), wte[token * C + c]) << "token " << token;
    }
  }
}

}  // namespace
}  // namespace paraflow::model
