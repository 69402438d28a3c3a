// The shapes of the partitioned training graphs: a pipeline stage's boundary values, and a
// tensor-parallel shard's split weights, its tp_copy / tp_reduce pairs and its slice of the
// vocabulary (no rank holds all the logits).
#include "model/gpt_graph.h"

#include <gtest/gtest.h>

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

TEST(GptGraph, AShardsElementsAreRunsOfTheWholeTensor) {
  // c_attn [4, 6] (C 2: q, k, v sections of 2 columns), shard 1 of 2: column 1 of each section.
  const TensorSpec qkv{"h.0.attn.c_attn.weight", Shape{4, 6}, Init::normal, true};
  const auto runs = shard_runs(qkv, TensorShard{1, 2});
  ASSERT_EQ(runs.size(), 12u);
  EXPECT_EQ(runs[0], (std::pair<int64_t, int64_t>{1, 1}));
  EXPECT_EQ(runs[1], (std::pair<int64_t, int64_t>{3, 1}));
  EXPECT_EQ(runs[3], (std::pair<int64_t, int64_t>{7, 1}));
  // c_proj [4, 2], shard 1 of 2: rows 2 and 3.
  const TensorSpec projection{"h.0.attn.c_proj.weight", Shape{4, 2}, Init::normal, true};
  EXPECT_EQ(shard_runs(projection, TensorShard{1, 2}), (std::vector<std::pair<int64_t, int64_t>>{{4, 4}}));
}

}  // namespace
}  // namespace paraflow::model
