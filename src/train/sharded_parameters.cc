#include "train/sharded_parameters.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "base/system_memory.h"

namespace paraflow::train {

namespace {

// A tensor's layer: its name up to its block number ("h.3.attn.c_attn.weight" -> "h.3",
// "model.layers.3.mlp..." -> "model.layers.3"), or the whole name outside the blocks.
std::string layer_of(const std::string& name) {
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
    size_t end = dot + 1;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > dot + 1 && (end == name.size() || name[end] == '.')) return name.substr(0, end);
  }
  return name;
}

}  // namespace

LayerSchedule::LayerSchedule(const model::GptGraph& graph, const std::vector<model::TensorSpec>& specs) {
  const graph::Graph& g = graph.graph;
  std::map<std::string, size_t> index_of_layer;
  std::vector<size_t> layer_of_value(g.values().size(), SIZE_MAX);
  int64_t offset = 0;
  for (const model::TensorSpec& spec : specs) {
    const std::string& name = spec.name;
    const auto [at, added] = index_of_layer.emplace(layer_of(name), layers_.size());
    if (added) layers_.emplace_back();
    auto& runs = layers_[at->second].runs;
    const int64_t count = spec.shape.numel();
    if (!runs.empty() && runs.back().first + runs.back().second == offset) {
      runs.back().second += count;
    } else {
      runs.push_back({offset, count});
    }
    offset += count;
    layer_of_value[static_cast<size_t>(graph.parameters.at(name))] = at->second;
  }
  // What each node reads: its inputs, and a backward node its forward node's too.
  needed_.resize(g.nodes().size());
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const graph::Node& node = g.nodes()[n];
    std::vector<graph::ValueId> read = node.inputs;
    if (node.is_backward && node.forward_node >= 0) {
      const auto& forward = g.nodes()[static_cast<size_t>(node.forward_node)].inputs;
      read.insert(read.end(), forward.begin(), forward.end());
    }
    for (graph::ValueId value : read) {
      const size_t layer = layer_of_value[static_cast<size_t>(value)];
      if (layer != SIZE_MAX && std::find(needed_[n].begin(), needed_[n].end(), layer) == needed_[n].end()) {
        needed_[n].push_back(layer);
      }
    }
  }
  freed_.resize(g.nodes().size());
  prefetch_.assign(g.nodes().size(), layers_.size());
  for (bool backward : {false, true}) {
    std::vector<size_t> phase;
    for (int32_t index : g.schedule()) {
      if (graph::Graph::in_backward_phase(g.nodes()[static_cast<size_t>(index)]) == backward) {
        phase.push_back(static_cast<size_t>(index));
      }
    }
    // A layer is freed after its last reader in the phase; each node prefetches the first layer
    // read after it that it does not read itself.
    std::vector<bool> seen(layers_.size(), false);
    for (size_t i = phase.size(); i-- > 0;) {
      for (size_t layer : needed_[phase[i]]) {
        if (!seen[layer]) freed_[phase[i]].push_back(layer);
        seen[layer] = true;
      }
    }
    for (size_t i = 0; i < phase.size(); ++i) {
      const std::vector<size_t>& mine = needed_[phase[i]];
      for (size_t j = i + 1; j < phase.size() && prefetch_[phase[i]] == layers_.size(); ++j) {
        for (size_t layer : needed_[phase[j]]) {
          if (std::find(mine.begin(), mine.end(), layer) == mine.end()) {
            prefetch_[phase[i]] = layer;
            break;
          }
        }
      }
    }
    sequence_.insert(sequence_.end(), phase.begin(), phase.end());
  }
}

int64_t LayerSchedule::peak_gathered_elements(int64_t shard_begin, int64_t shard_end) const {
  auto outside_shard = [&](size_t layer) {
    int64_t count = 0;
    for (const auto& [offset, elements] : layers_[layer].runs) {
      const int64_t overlap = std::max<int64_t>(0, std::min(offset + elements, shard_end) - std::max(offset, shard_begin));
      count += elements - overlap;
    }
    return count;
  };
  std::vector<bool> resident(layers_.size(), false);
  int64_t now = 0, peak = 0;
  auto gather = [&](size_t layer) {
    if (layer < layers_.size() && !resident[layer]) {
      resident[layer] = true;
      now += outside_shard(layer);
    }
  };
  for (size_t n : sequence_) {
    for (size_t layer : needed_[n]) gather(layer);
    gather(prefetch_[n]);
    peak = std::max(peak, now);
    for (size_t layer : freed_[n]) {
      if (resident[layer]) now -= outside_shard(layer);
      resident[layer] = false;
    }
  }
  return peak;
}

ShardedParameters::ShardedParameters(const model::GptGraph& graph, const model::ParameterSet& parameters,
                                     dist::GradientSync& sync)
    : schedule_(graph, parameters.specs()),
      data_(parameters.flat().device_data<float>()),
      sync_(sync),
      resident_(schedule_.layers().size(), true),
      pending_(schedule_.layers().size()) {}

void ShardedParameters::ensure(size_t layer) {
  if (resident_[layer]) return;
  if (!pending_[layer].valid()) pending_[layer] = sync_.gather_ranges(data_, schedule_.layers()[layer].runs);
  pending_[layer].get();
  resident_[layer] = true;
}

void ShardedParameters::before_node(size_t node) {
  for (size_t layer : schedule_.needed_by(node)) ensure(layer);
  // The next layer's gather, on the communication thread while this node computes.
  const size_t next = schedule_.prefetched_at(node);
  if (next < resident_.size() && !resident_[next] && !pending_[next].valid()) {
    pending_[next] = sync_.gather_ranges(data_, schedule_.layers()[next].runs);
  }
}

void ShardedParameters::after_node(size_t node) {
  for (size_t layer : schedule_.freed_after(node)) release(layer);
}

void ShardedParameters::release(size_t layer) {
  if (!resident_[layer]) return;
  resident_[layer] = false;
  // Outside this rank's shard only (a page shared with a neighbour stays; an empty range is none).
  for (const auto& [offset, count] : schedule_.layers()[layer].runs) {
    release_pages(data_ + offset, data_ + std::min(offset + count, sync_.shard_begin()));
    release_pages(data_ + std::max(offset, sync_.shard_end()), data_ + offset + count);
  }
}

void ShardedParameters::release_all() {
  for (auto& pending : pending_) {
    if (pending.valid()) pending.get();
  }
  resident_.assign(resident_.size(), true);
  for (size_t layer = 0; layer < resident_.size(); ++layer) release(layer);
}

}  // namespace paraflow::train
