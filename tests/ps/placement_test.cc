// The variables' placement on ps tasks, against a placement worked out by hand; every element
// placed once for GPT-2 and for a Llama with an untied head (its two vocabulary tables split).
#include <gtest/gtest.h>

#include "model_configs.h"
#include "ps/placement.h"

namespace paraflow::ps {
namespace {

model::TensorSpec spec(const std::string& name, Shape shape) { return {name, shape, model::Init::zeros, true}; }

// The embedding table as the model lists it (split by vocabulary rows): 4 rows of 2.
model::TensorSpec embedding_table() {
  return model::gpt_tensor_specs(testing::gpt_config(4, 8, 2, 0, 1)).front();
}

TEST(PlacementTest, SplitsTheEmbeddingByRowsThenBalancesTheRestLargestFirst) {
  // wte 4x2 (8 elements at 0), a 10 at 8, b 6 at 18, c 5 at 24, d 3 at 29. Two ps tasks:
  // wte rows 0-1 and 2-3 give 4 each; then a (10) -> ps 0 (tie: the first), b (6) -> ps 1 (10 < 14),
  // c (5) -> ps 1 (10 < 14 again), d (3) -> ps 0 (14 < 15).
  const Placement placement = place_variables(
      {spec("a", Shape{10}), embedding_table(), spec("b", Shape{6}), spec("c", Shape{5}),
       spec("d", Shape{3})},
      2);
  ASSERT_EQ(placement.shards.size(), 2u);
  auto names = [&](size_t task) {
    std::vector<std::string> out;
    for (const Piece& piece : placement.shards[task]) out.push_back(piece.tensor);
    return out;
  };
  EXPECT_EQ(names(0), (std::vector<std::string>{"a", "wte.weight[0:2]", "d"}));
  EXPECT_EQ(names(1), (std::vector<std::string>{"wte.weight[2:4]", "b", "c"}));
  // Offsets in the flat buffer: a 0..10, wte 10..18 (rows of 2), b 18, c 24, d 29.
  EXPECT_EQ(placement.shards[0][0].offset, 0);
  EXPECT_EQ(placement.shards[0][1].offset, 10);
  EXPECT_EQ(placement.shards[0][1].count, 4);
  EXPECT_EQ(placement.shards[1][0].offset, 14);
  EXPECT_EQ(placement.shards[1][1].offset, 18);
  EXPECT_EQ(placement.shards[1][2].offset, 24);
  EXPECT_EQ(placement.shards[0][2].offset, 29);
  EXPECT_EQ(placement.shard_elements(0), 17);
  EXPECT_EQ(placement.shard_elements(1), 15);
}

TEST(PlacementTest, CoversEveryElementOnceForAnyNumberOfTasks) {
  // Vocabulary rows that do not split evenly.
  for (const model::GptConfig& config : {testing::gpt_config(101, 32, 16, 3, 2),
                                         testing::llama_config("llama", 101, 32, 16, 24, 3, 2, 1, 8)}) {
    SCOPED_TRACE(config.model_type);
    const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(config);
    const int64_t total = model::element_count(specs);
    int64_t largest = 0;  // outside the vocabulary tables
    for (const auto& spec : specs) {
      if (!model::splits_vocabulary(spec)) largest = std::max(largest, spec.shape.numel());
    }
    for (int tasks : {1, 2, 3, 7}) {
      const Placement placement = place_variables(specs, tasks);
      std::vector<int> covered(static_cast<size_t>(total), 0);
      for (const auto& shard : placement.shards) {
        for (const Piece& piece : shard) {
          for (int64_t i = piece.offset; i < piece.offset + piece.count; ++i) ++covered[static_cast<size_t>(i)];
        }
      }
      EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), total) << tasks << " tasks";
      // Greedy placement leaves no task more than the largest tensor it placed (plus a row of each
      // vocabulary table, from blocks of rows that differ by one) above another.
      int64_t most = 0, least = total;
      for (size_t task = 0; task < placement.shards.size(); ++task) {
        most = std::max(most, placement.shard_elements(task));
        least = std::min(least, placement.shard_elements(task));
      }
      EXPECT_LE(most - least, largest + 2 * config.n_embd) << tasks << " tasks";
      EXPECT_EQ(place_variables(specs, tasks).digest(), placement.digest()) << "the placement is deterministic";
    }
    EXPECT_NE(place_variables(specs, 2).digest(), place_variables(specs, 3).digest());
    EXPECT_THROW(place_variables(specs, 0), InputError);
  }
}

}  // namespace
}  // namespace paraflow::ps
