// An op definition: shape inference with its checks (written once), and forward/backward that
// call the backend's kernels. One file per op in graph/ops/.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "graph/collective_group.h"
#include "graph/graph.h"

namespace paraflow::graph {

struct OutputSpec {
  std::string suffix;  // output value name = node name + suffix
  Shape shape;
  DType dtype;
  ValueRole role;
};

// The tensors a kernel sees. For backward, input_grads[i] is undefined when input i needs none,
// and output_grads[i] is undefined for saved outputs; accumulate[i] says whether input_grads[i]
// already holds contributions to add to (false: this node is its first writer and assigns).
struct NodeTensors {
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<Tensor> input_grads;
  std::vector<Tensor> output_grads;
  std::vector<bool> accumulate;
  CollectiveGroup* group = nullptr;  // the executor's tensor-parallel group, if it was given one
};

class OpDef {
 public:
  virtual ~OpDef() = default;
  virtual std::vector<OutputSpec> infer(const std::vector<const Value*>& inputs, const Attributes& attributes) const = 0;
  virtual void forward(Backend& backend, const NodeTensors& tensors, const Attributes& attributes) const = 0;
  virtual void backward(Backend& backend, const NodeTensors& tensors, const Attributes& attributes) const = 0;
  // The kernels forward and backward launch: a backend runs the op in a dtype when it has them all
  // (the forward ones, when nothing will run backward).
  virtual std::vector<KernelOp> kernels() const = 0;
  bool runs_in(const Backend& backend, DType dtype, bool with_backward = true) const;
  // Small inputs read on the host (a position): the executor keeps them in host memory, as
  // TensorFlow's HostMemory() does, whatever device runs the op.
  virtual bool host_memory_input(size_t index) const { (void)index; return false; }
  // Inputs that can never have a gradient (token ids, targets).
  virtual bool differentiable_input(size_t index) const { (void)index; return true; }
  // Whether backward can assign (rather than only accumulate) input i's gradient; the executor
  // then skips zeroing that gradient when this node writes it first.
  virtual bool can_assign_input_grad(size_t index) const { (void)index; return false; }
  // Whether input i may be a 16-bit (bf16/f16) activation, read directly by the kernel when the
  // backend runs_in() that type; the output then has the same type. The precision policy gives
  // other inputs f32 copies.
  virtual bool accepts_half_input(size_t index) const { (void)index; return false; }
  // Whether output i takes the 16-bit type when the op reads 16-bit inputs (the activation; also
  // matmul's saved pre-activation), rather than the type infer() gave it.
  virtual bool output_follows_half_inputs(size_t index) const { return index == 0; }
  // What backward reads of the forward tensors; the memory planner frees the rest after forward.
  virtual bool backward_reads_input(size_t index) const { (void)index; return true; }
  virtual bool backward_reads_output(size_t index) const { (void)index; return true; }
};

const OpDef& op_def(OpKind kind);

// Shape-check helper for op definitions: throws InputError "<op>: <what> ..." when false.
void expect_shape(bool condition, const char* op, const std::string& what, const Shape& shape);

}  // namespace paraflow::graph
