// Runs a graph on a backend. The caller binds inputs, parameters (and their gradients, so that
// all of them can live in flat buffers) and state; the executor allocates every other value
// once and reuses it across runs. It knows nothing about models.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"
#include "graph/memory_plan.h"
#include "graph/op.h"

namespace paraflow::graph {

class Executor {
 public:
  Executor(const Graph& graph, Backend& backend);

  void bind(ValueId id, const Tensor& tensor);
  // The caller reads this value between runs, so it gets a buffer of its own.
  void keep(ValueId id);
  // Allocates activations, gradients and inputs on first use when unbound; callers feed an
  // input by uploading into its tensor (or writing it, for an op's host-memory input).
  // Parameters and state must be bound.
  const Tensor& tensor(ValueId id);

  void forward();
  // A ragged batch with one graph: later forward() runs see only the first `rows` entries of
  // dimension 0 of every input and activation whose dimension 0 is `capacity` (the graph was
  // built for up to `capacity` tokens; parameters and state keep their shapes). rows == capacity
  // runs the full graph again.
  void set_rows(int64_t capacity, int64_t rows);
  // Runs the backward nodes. Unbound gradients (activations') are assigned by their first
  // writer, or zeroed first when that op can only accumulate. Bound gradients (parameters',
  // the loss's) are the caller's: they accumulate until it zeroes them.
  void backward();

  // Called after each backward node with its index in graph().nodes(); gradient
  // synchronisation uses it to start all-reducing buckets while backward goes on.
  void set_backward_hook(std::function<void(size_t)> hook) { backward_hook_ = std::move(hook); }

  // Called before and after every node that runs, forward and backward, with its index: ZeRO-3
  // gathers a layer's parameters before the first node that reads them and frees them after the
  // last one.
  void set_node_hooks(std::function<void(size_t)> before, std::function<void(size_t)> after) {
    before_node_ = std::move(before);
    after_node_ = std::move(after);
  }

  // The group tensor-parallel ops (tp_copy, tp_reduce) reduce over; set before the first run.
  void set_collective_group(CollectiveGroup* group) { group_ = group; }

  // Per-op wall time, summed by "<op kind> forward|backward" ("<node name> ..." for a node with
  // the attribute profile_apart), when profiling is on. Backends
  // are synchronised around each node, so the times are exact but the run is a little slower.
  void set_profiling(bool enabled) { profiling_ = enabled; }
  const std::map<std::string, double>& profile() const { return profile_; }

  // Plans memory now if not yet done (it happens on the first run otherwise).
  const MemoryPlan& memory_plan();

  const Graph& graph() const { return graph_; }
  Backend& backend() { return backend_; }

 private:
  NodeTensors gather(size_t node_index);
  void run(size_t node_index);
  void run_hooked(size_t node_index);  // run() between the node hooks
  // Decides, for every unbound gradient, whether its first writer assigns it or the gradient
  // must be zeroed right before that writer, and which later writers accumulate.
  void plan_gradient_writes();
  // Lays out every value the caller does not own in one arena (graph/memory_plan.h).
  void plan();

  const Graph& graph_;
  Backend& backend_;
  std::vector<Tensor> tensors_;
  std::vector<bool> bound_;
  std::vector<bool> kept_;
  std::vector<bool> host_memory_;  // read on the host by some op (OpDef::host_memory_input)
  std::vector<std::vector<bool>> accumulate_;  // per node, per input: accumulate into its gradient
  std::vector<std::vector<ValueId>> zero_first_;  // per node: gradients to zero before it runs
  std::vector<NodeTensors> gathered_;              // per node, once planned
  std::vector<NodeTensors> row_views_;             // gathered_ cut to set_rows()' rows, when set
  int64_t rows_ = -1;                              // the last set_rows()' rows
  bool planned_ = false;
  MemoryPlan memory_plan_;
  Tensor arena_;
  std::function<void(size_t)> backward_hook_, before_node_, after_node_;
  CollectiveGroup* group_ = nullptr;
  bool profiling_ = false;
  std::map<std::string, double> profile_;
};

}  // namespace paraflow::graph
