// swiglu: Llama's gated MLP activation, out = silu(gate) * up.
// inputs: gate (...,F), up (same shape); outputs: out (same shape)
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class SwigluOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    check(in.size() == 2, "swiglu: expected 2 inputs, got {}", in.size());
    expect_shape(in[1]->shape == in[0]->shape, "swiglu", "gate and up must have one shape", in[1]->shape);
    return {{"", in[0]->shape, in[0]->dtype, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    // A precision policy stores both in 16 bits or neither (both are linear layers' outputs).
    check(t.inputs[0].dtype() == t.inputs[1].dtype(), "swiglu: gate is {} but up is {}", dtype_name(t.inputs[0].dtype()),
          dtype_name(t.inputs[1].dtype()));
    backend.launch(SwigluForward{.out = t.outputs[0], .gate = t.inputs[0], .up = t.inputs[1]});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(SwigluBackward{.dgate = t.input_grads[0],
                                  .dup = t.input_grads[1],
                                  .dout = t.output_grads[0],
                                  .gate = t.inputs[0],
                                  .up = t.inputs[1],
                                  .accumulate_gate = t.accumulate[0],
                                  .accumulate_up = t.accumulate[1]});
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::swiglu_forward, KernelOp::swiglu_backward}; }
  bool can_assign_input_grad(size_t) const override { return true; }
  bool accepts_half_input(size_t) const override { return true; }
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& swiglu_op() {
  static SwigluOp op;
  return op;
}

}  // namespace paraflow::graph
