// ZeRO-3 over data-parallel replicas: each rank keeps only its shard of the flat parameter buffer
// (GradientSync's flat ranges) resident. A layer's parameters (a transformer block's tensors, or
// an embedding or a final norm on its own) are gathered from their owners just before the first
// node that reads them and their pages handed back to the kernel after the last one, in forward
// and again in backward; the next layer's gather runs on the communication thread while this
// layer computes, as FSDP's prefetch does. The buffer keeps its addresses, so the executor's
// bindings stay valid; a freed page reads as zeros until it is gathered again.
#pragma once

#include <future>
#include <utility>
#include <vector>

#include "dist/gradient_sync.h"
#include "model/gpt_graph.h"

namespace paraflow::train {

// When each layer is gathered, prefetched and freed as a graph's nodes run: pure bookkeeping,
// shared by the trainer and `paraflow plan`.
class LayerSchedule {
 public:
  // `specs`: the tensors of the flat buffer, in order (ParameterSet's layout, without gaps).
  LayerSchedule(const model::GptGraph& graph, const std::vector<model::TensorSpec>& specs);

  struct Layer {
    std::vector<std::pair<int64_t, int64_t>> runs;  // (offset, count) in the flat buffer
  };
  const std::vector<Layer>& layers() const { return layers_; }
  const std::vector<size_t>& needed_by(size_t node) const { return needed_[node]; }
  const std::vector<size_t>& freed_after(size_t node) const { return freed_[node]; }
  // The next layer its phase needs after this node (layers().size() when none): prefetched.
  size_t prefetched_at(size_t node) const { return prefetch_[node]; }
  // The most elements outside [shard_begin, shard_end) resident at once.
  int64_t peak_gathered_elements(int64_t shard_begin, int64_t shard_end) const;

 private:
  std::vector<Layer> layers_;
  std::vector<std::vector<size_t>> needed_, freed_;
  std::vector<size_t> prefetch_;
  std::vector<size_t> sequence_;  // the nodes in the order they run: forward, then backward
};

class ShardedParameters {
 public:
  ShardedParameters(const model::GptGraph& graph, const model::ParameterSet& parameters, dist::GradientSync& sync);

  // The executor's node hooks.
  void before_node(size_t node);
  void after_node(size_t node);
  // Frees every layer outside this rank's shard: after start-up, and after the optimizer step
  // changed every rank's shard.
  void release_all();

 private:
  void ensure(size_t layer);
  void release(size_t layer);

  LayerSchedule schedule_;
  float* data_;
  dist::GradientSync& sync_;
  std::vector<bool> resident_;
  std::vector<std::future<void>> pending_;  // per layer: its gather in flight
};

}  // namespace paraflow::train
