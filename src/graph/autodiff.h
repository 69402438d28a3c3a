// Reverse-mode autodiff as a graph pass: for every value the loss depends on through
// differentiable inputs, a gradient value; for every forward node on that path, in reverse
// order, a backward node that accumulates into its inputs' gradients.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace paraflow::graph {

// Adds gradient values and backward nodes to `graph` for the scalar-per-position `loss` value.
// Afterwards graph.value(loss).grad is the value the caller fills with d(objective)/d(loss).
// `loss` may be any activation whose gradient the caller provides (a pipeline stage's output,
// with the gradient from the next stage); `inputs_with_grads` are inputs whose gradients the
// caller wants (a pipeline stage's input, whose gradient goes to the previous stage).
void add_backward_pass(Graph& graph, ValueId loss, const std::vector<ValueId>& inputs_with_grads = {});

}  // namespace paraflow::graph
