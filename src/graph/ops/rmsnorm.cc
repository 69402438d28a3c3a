// rmsnorm over the last axis (Llama's): out = x / sqrt(mean(x²) + eps) * weight.
// inputs: x (...,C), weight (C); attributes: eps (float)
// outputs: out (...,C); saved rstd (N)
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class RmsNormOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 2, "rmsnorm: expected 2 inputs, got {}", in.size());
    const Shape& x = in[0]->shape;
    expect_shape(in[1]->shape == Shape{x[x.rank() - 1]}, "rmsnorm", "weight must be (C)", in[1]->shape);
    attributes.get_float("eps");
    return {{"", x, in[0]->dtype, ValueRole::activation}, {".rstd", Shape{leading_rows(x)}, DType::f32, ValueRole::saved}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(RmsnormForward{.out = t.outputs[0],
                                  .rstd = t.outputs[1],
                                  .inp = t.inputs[0],
                                  .weight = t.inputs[1],
                                  .eps = static_cast<float>(attributes.get_float("eps"))});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(RmsnormBackward{.dinp = t.input_grads[0],
                                   .dweight = t.input_grads[1],
                                   .dout = t.output_grads[0],
                                   .inp = t.inputs[0],
                                   .weight = t.inputs[1],
                                   .rstd = t.outputs[1],
                                   .accumulate_dinp = t.accumulate[0]});
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::rmsnorm_forward, KernelOp::rmsnorm_backward}; }
  bool can_assign_input_grad(size_t index) const override { return index == 0; }
  bool accepts_half_input(size_t index) const override { return index == 0; }
  bool backward_reads_output(size_t index) const override { return index == 1; }  // rstd
};

}  // namespace

const OpDef& rmsnorm_op() {
  static RmsNormOp op;
  return op;
}

}  // namespace paraflow::graph
