// ZeRO-3's layer schedule on a 3-block GPT-2, checked against the graph itself: every layer a
// node reads is gathered before it runs (needed or prefetched by then) and freed only after its
// last reader in each phase; each block's gather is issued by a node of the layer before it
// (so it overlaps that layer's compute); and no more than two blocks are resident at once.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "backend/backend.h"
#include "model_configs.h"
#include "train/sharded_parameters.h"
#include "train/training_graph.h"

namespace paraflow {
namespace {

TEST(LayerSchedule, LayersAreGatheredBeforeUseFreedAfterAndPrefetchedOneAhead) {
  const model::GptConfig config = testing::gpt_config(64, 16, 24, 3, 2);
  const model::GptGraph g = train::build_training_graph(config, 2, 16, "none", graph::PrecisionPolicy::float32,
                                                        cpu_backend(), model::LayerRange{}, model::TensorShard{});
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(config);
  const train::LayerSchedule schedule(g, specs);
  // wte, wpe, ln_f.weight, ln_f.bias and the 3 blocks.
  ASSERT_EQ(schedule.layers().size(), 7u);
  int64_t total = 0, largest_block = 0;
  for (const auto& layer : schedule.layers()) {
    ASSERT_EQ(layer.runs.size(), 1u);  // a block's tensors lie together in the flat buffer
    total += layer.runs[0].second;
  }
  ASSERT_EQ(total, config.parameter_count());
  // The blocks' layers, by where their tensors start.
  std::set<size_t> blocks;
  int64_t offset = 0;
  for (const auto& spec : specs) {
    if (spec.name.rfind("h.0.", 0) == 0) largest_block += spec.shape.numel();
    for (size_t layer = 0; layer < schedule.layers().size(); ++layer) {
      if (spec.name.find(".ln_1.weight") != std::string::npos && schedule.layers()[layer].runs[0].first == offset) {
        blocks.insert(layer);
      }
    }
    offset += spec.shape.numel();
  }
  ASSERT_EQ(blocks.size(), 3u);

  for (bool backward : {false, true}) {
    std::set<size_t> resident;
    std::vector<size_t> first_use;  // the layers in the order the phase first reads them
    std::map<size_t, size_t> prefetched_during;  // layer -> the layer whose node prefetched it
    for (int32_t index : g.graph.schedule()) {
      const auto node = static_cast<size_t>(index);
      if (graph::Graph::in_backward_phase(g.graph.nodes()[node]) != backward) continue;
      for (size_t layer : schedule.needed_by(node)) {
        if (std::find(first_use.begin(), first_use.end(), layer) == first_use.end()) first_use.push_back(layer);
        resident.insert(layer);
      }
      const size_t next = schedule.prefetched_at(node);
      if (next < schedule.layers().size() && !resident.count(next) && !schedule.needed_by(node).empty()) {
        prefetched_during.emplace(next, schedule.needed_by(node).front());
        resident.insert(next);
      }
      for (size_t layer : schedule.freed_after(node)) {
        EXPECT_TRUE(resident.erase(layer)) << "layer " << layer << " freed twice or never gathered";
      }
    }
    EXPECT_TRUE(resident.empty()) << "every layer is freed by the end of the phase";
    EXPECT_EQ(first_use.size(), 7u) << (backward ? "backward" : "forward") << " reads every layer";
    // Each block is prefetched while another layer's node runs. (Not every layer: wpe is read
    // by wte's node, ln_f.bias by ln_f.weight's.)
    for (size_t block : blocks) {
      ASSERT_TRUE(prefetched_during.count(block)) << "block layer " << block << " is not prefetched";
      EXPECT_NE(prefetched_during.at(block), block);
    }
  }
  // Nothing of it is this rank's: the peak holds the embeddings (the tied head reads wte last) and
  // two blocks, never all three.
  const int64_t peak = schedule.peak_gathered_elements(0, 0);
  EXPECT_GE(peak, 2 * largest_block);
  EXPECT_LT(peak, total - largest_block / 2);
  // A rank that owns everything gathers nothing.
  EXPECT_EQ(schedule.peak_gathered_elements(0, total), 0);
}

}  // namespace
}  // namespace paraflow
