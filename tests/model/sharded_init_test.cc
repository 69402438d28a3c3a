// Sharded initialisation: every part of the model (a pipeline stage's tensors, as a
// tensor-parallel shard holds them) initialised on its own equals, bit for bit, the same elements
// of the whole model initialised in one piece; and the draws are N(0, 0.02) as GPT-2 asks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/parameters.h"
#include "model_configs.h"

namespace paraflow::model {
namespace {

TEST(ShardedInit, EveryPartEqualsItsElementsOfTheWholeModel) {
  const GptConfig config = testing::gpt_config(64, 16, 8, 4, 4);  // 4 heads: split over up to 4 shards
  const std::vector<TensorSpec> specs = gpt_tensor_specs(config);
  ParameterSet whole(specs, cpu_backend());
  initialize_gpt(whole, config, 1337);
  for (const LayerRange range : {LayerRange{}, LayerRange{0, 2, true, false}, LayerRange{2, -1, false, true}}) {
    for (int tensor_parallel : {1, 2, 4}) {
      for (int rank = 0; rank < tensor_parallel; ++rank) {
        const TensorShard shard{rank, tensor_parallel};
        ParameterSet part(part_tensor_specs(specs, range, shard), cpu_backend());
        initialize_gpt(part, config, 1337, shard);
        for (size_t i = 0; i < part.specs().size(); ++i) {
          const TensorSpec& spec = part.specs()[i];
          const Tensor& mine = part.at(i);
          const Tensor& full = whole.get(spec.name);
          // Element by element through the placements: global (r, c) of the whole, local of the part.
          const int64_t global_columns = full.shape().dims().back(), local_columns = mine.shape().dims().back();
          for (const SlicePlacement& at : shard_slices(spec, shard)) {
            const bool matrix = full.shape().rank() == 2;
            const int64_t rows = matrix ? at.global.lengths[0] : 1;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t c = 0; c < at.global.lengths.back(); ++c) {
                const int64_t g = ((matrix ? at.global.offsets[0] : 0) + r) * global_columns + at.global.offsets.back() + c;
                const int64_t l = ((matrix ? at.local.offsets[0] : 0) + r) * local_columns + at.local.offsets.back() + c;
                const float a = full.data<float>()[g], b = mine.data<float>()[l];
                ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << spec.name << " tp " << tensor_parallel << " rank " << rank;
              }
            }
          }
        }
      }
    }
  }
}

// A ZeRO-3 rank initialises only its range of the flat buffer: those elements equal the whole
// part's, bit for bit, and nothing outside the range is written.
TEST(ShardedInit, ARangeWritesItsElementsOnly) {
  const GptConfig config = testing::gpt_config(64, 16, 8, 4, 4);
  const std::vector<TensorSpec> specs = gpt_tensor_specs(config);
  const TensorShard shard{1, 2};
  const std::vector<TensorSpec> part_specs = part_tensor_specs(specs, LayerRange{}, shard);
  ParameterSet reference(part_specs, cpu_backend());
  initialize_gpt(reference, config, 1337, shard);
  const int64_t count = reference.numel();
  // Ranges that start and end mid-row, span several tensors, or cover one element.
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {5, 83}, {37, count / 2 + 3}, {count / 3, count - 17}, {count - 1, count}, {0, count}}) {
    ParameterSet part(part_specs, cpu_backend());
    float* data = part.flat().data<float>();
    std::fill(data, data + count, std::numeric_limits<float>::quiet_NaN());
    initialize_gpt(part, config, 1337, shard, begin, end);
    for (int64_t i = 0; i < count; ++i) {
      if (i >= begin && i < end) {
        ASSERT_EQ(std::memcmp(&data[i], &reference.flat().data<float>()[i], sizeof(float)), 0)
            << "element " << i << " of range [" << begin << ", " << end << ")";
      } else {
        ASSERT_TRUE(std::isnan(data[i])) << "element " << i << " outside range [" << begin << ", " << end << ") written";
      }
    }
  }
}

TEST(ShardedInit, DrawsFollowGpt2sDistribution) {
  const GptConfig config = testing::gpt_config(512, 16, 64, 2, 2);
  ParameterSet parameters(gpt_tensor_specs(config), cpu_backend());
  initialize_gpt(parameters, config, 7);
  const Tensor& table = parameters.get("wte.weight");  // 32768 draws of N(0, 0.02)
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < table.numel(); ++i) {
    sum += table.data<float>()[i];
    squares += static_cast<double>(table.data<float>()[i]) * table.data<float>()[i];
  }
  const double n = static_cast<double>(table.numel()), mean = sum / n, sd = std::sqrt(squares / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 4 * 0.02 / std::sqrt(n));
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.02);
  // The residual projections: 0.02 / sqrt(2 n_layer); gains ones; biases zeros.
  const Tensor& projection = parameters.get("h.0.attn.c_proj.weight");
  double projection_squares = 0;
  for (int64_t i = 0; i < projection.numel(); ++i) projection_squares += std::pow(projection.data<float>()[i], 2);
  EXPECT_NEAR(std::sqrt(projection_squares / static_cast<double>(projection.numel())), 0.01, 0.01 * 0.05);
  EXPECT_EQ(parameters.get("h.1.ln_2.weight").data<float>()[3], 1.0f);
  EXPECT_EQ(parameters.get("h.1.mlp.c_fc.bias").data<float>()[5], 0.0f);
  // Another seed, other values; the same seed, the same.
  ParameterSet other(gpt_tensor_specs(config), cpu_backend()), again(gpt_tensor_specs(config), cpu_backend());
  initialize_gpt(other, config, 8);
  initialize_gpt(again, config, 7);
  EXPECT_NE(other.get("wte.weight").data<float>()[0], table.data<float>()[0]);
  EXPECT_EQ(std::memcmp(again.flat().raw(), parameters.flat().raw(), parameters.flat().nbytes()), 0);
}

}  // namespace
}  // namespace paraflow::model
