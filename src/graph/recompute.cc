#include "graph/recompute.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "graph/op.h"

namespace paraflow::graph {

namespace {

void recompute_regions_in(Graph& graph, const std::vector<std::vector<int32_t>>& regions, bool drop_everything) {
  // Who reads each value during backward: backward nodes, by what their op reads.
  std::vector<std::vector<int32_t>> backward_readers(graph.values().size());
  std::map<int32_t, std::vector<int32_t>> backward_nodes_of;  // forward node -> its backward nodes
  for (int32_t n : graph.schedule()) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    if (!node.is_backward) continue;
    backward_nodes_of[node.forward_node].push_back(n);
    const OpDef& def = op_def(node.kind);
    const std::vector<ValueId>& inputs = graph.backward_inputs(node);
    const std::vector<ValueId>& outputs = graph.backward_outputs(node);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (def.backward_reads_input(i)) backward_readers[static_cast<size_t>(inputs[i])].push_back(n);
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (def.backward_reads_output(i)) backward_readers[static_cast<size_t>(outputs[i])].push_back(n);
    }
  }

  for (const std::vector<int32_t>& region : regions) {
    std::set<int32_t> members(region.begin(), region.end());
    std::set<int32_t> region_backward;
    for (int32_t f : region) {
      for (int32_t b : backward_nodes_of[f]) region_backward.insert(b);
    }
    if (region_backward.empty()) continue;
    // Dropped: produced in the region and read in backward only by the region's backward nodes.
    std::map<ValueId, int32_t> producer;
    std::set<ValueId> dropped;
    for (int32_t f : region) {
      for (ValueId out : graph.nodes()[static_cast<size_t>(f)].outputs) {
        producer[out] = f;
        const auto& readers = backward_readers[static_cast<size_t>(out)];
        bool only_region = std::all_of(readers.begin(), readers.end(), [&](int32_t r) { return region_backward.count(r); });
        if (only_region || drop_everything) dropped.insert(out);
      }
    }
    // Producers to re-run: those of dropped values the region's backward reads, and, transitively,
    // of dropped values those producers read.
    std::set<int32_t> rerun;
    std::vector<ValueId> pending;
    for (ValueId v : dropped) {
      const auto& readers = backward_readers[static_cast<size_t>(v)];
      if (!readers.empty()) pending.push_back(v);
    }
    while (!pending.empty()) {
      ValueId v = pending.back();
      pending.pop_back();
      int32_t f = producer.at(v);
      if (!rerun.insert(f).second) continue;
      for (ValueId in : graph.nodes()[static_cast<size_t>(f)].inputs) {
        if (dropped.count(in)) pending.push_back(in);
      }
    }
    if (rerun.empty()) continue;
    // Backward nodes that will read a copy: the region's own, and (dropping everything) any
    // other reader of a dropped value. Recompute goes right before the first of them.
    std::set<int32_t> rewired = region_backward;
    for (ValueId v : dropped) {
      for (int32_t reader : backward_readers[static_cast<size_t>(v)]) rewired.insert(reader);
    }
    int32_t first_backward = -1;
    for (int32_t n : graph.schedule()) {
      if (rewired.count(n)) {
        first_backward = n;
        break;
      }
    }
    std::map<ValueId, ValueId> copy_of;
    auto mapped = [&](const std::vector<ValueId>& values) {
      std::vector<ValueId> result;
      for (ValueId v : values) result.push_back(copy_of.count(v) ? copy_of[v] : v);
      return result;
    };
    for (int32_t f : region) {  // forward order
      if (!rerun.count(f)) continue;
      const Node original = graph.nodes()[static_cast<size_t>(f)];
      std::vector<ValueId> outputs;
      for (ValueId out : original.outputs) {
        const Value& value = graph.value(out);
        // Copies exist only for backward: "saved", so an unread one is scratch, never an output.
        ValueId copy = graph.add_value(value.name + "@recompute", value.shape, value.dtype, ValueRole::saved);
        graph.value(copy).grad = graph.value(out).grad;  // backward finds the same gradient
        copy_of[out] = copy;
        outputs.push_back(copy);
      }
      graph.add_recompute_node(f, mapped(original.inputs), outputs, first_backward);
    }
    for (int32_t b : rewired) {
      const Node& node = graph.nodes()[static_cast<size_t>(b)];
      std::vector<ValueId> inputs = mapped(graph.backward_inputs(node));
      std::vector<ValueId> outputs = mapped(graph.backward_outputs(node));
      graph.set_backward_values(b, std::move(inputs), std::move(outputs));
    }
  }
}

}  // namespace

void add_recompute(Graph& graph, const std::vector<std::vector<int32_t>>& regions) {
  recompute_regions_in(graph, regions, false);
}

void add_recompute_everywhere(Graph& graph, const std::vector<std::vector<int32_t>>& regions) {
  recompute_regions_in(graph, regions, true);
}

std::vector<std::vector<int32_t>> recompute_regions(const Graph& graph, const std::string& policy,
                                                    const std::string& block_prefix) {
  std::vector<std::vector<int32_t>> regions;
  if (policy == "none" || policy.empty()) return regions;
  const auto& nodes = graph.nodes();
  if (policy == "block") {
    std::map<int64_t, std::vector<int32_t>> blocks;
    for (size_t n = 0; n < nodes.size(); ++n) {
      const Node& node = nodes[n];
      if (node.is_backward || node.is_recompute || node.name.rfind(block_prefix, 0) != 0) continue;
      size_t dot = node.name.find('.', block_prefix.size());
      blocks[std::stoll(node.name.substr(block_prefix.size(), dot - block_prefix.size()))].push_back(
          static_cast<int32_t>(n));
    }
    for (auto& [index, members] : blocks) regions.push_back(std::move(members));
    return regions;
  }
  std::set<std::string> kinds;
  std::stringstream list(policy == "attention" ? std::string("attention") : policy);
  for (std::string kind; std::getline(list, kind, ',');) {
    bool known = false;
    for (OpKind candidate : all_op_kinds()) known = known || kind == op_kind_name(candidate);
    check(known, "train.recompute: '{}' is not none, block, attention or a list of op kinds", kind);
    kinds.insert(kind);
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    if (!node.is_backward && !node.is_recompute && kinds.count(op_kind_name(node.kind))) {
      regions.push_back({static_cast<int32_t>(n)});
    }
  }
  return regions;
}

}  // namespace paraflow::graph
