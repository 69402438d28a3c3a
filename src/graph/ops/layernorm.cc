// layernorm over the last axis: out = (x - mean) * rstd * weight + bias.
// inputs: x (...,C), weight (C), bias (C); attributes: eps (float)
// outputs: out (...,C); saved mean (N), rstd (N)
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class LayerNormOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 3, "layernorm: expected 3 inputs, got {}", in.size());
    const Shape& x = in[0]->shape;
    int64_t C = x[x.rank() - 1];
    expect_shape(in[1]->shape == Shape{C} && in[2]->shape == Shape{C}, "layernorm", "weight and bias must be (C)",
                 in[1]->shape);
    attributes.get_float("eps");
    Shape rows{leading_rows(x)};
    return {{"", x, in[0]->dtype, ValueRole::activation},
            {".mean", rows, DType::f32, ValueRole::saved},
            {".rstd", rows, DType::f32, ValueRole::saved}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(LayernormForward{.out = t.outputs[0],
                                    .mean = t.outputs[1],
                                    .rstd = t.outputs[2],
                                    .inp = t.inputs[0],
                                    .weight = t.inputs[1],
                                    .bias = t.inputs[2],
                                    .eps = static_cast<float>(attributes.get_float("eps"))});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(LayernormBackward{.dinp = t.input_grads[0],
                                     .dweight = t.input_grads[1],
                                     .dbias = t.input_grads[2],
                                     .dout = t.output_grads[0],
                                     .inp = t.inputs[0],
                                     .weight = t.inputs[1],
                                     .mean = t.outputs[1],
                                     .rstd = t.outputs[2],
                                     .accumulate_dinp = t.accumulate[0]});
  }

  std::vector<KernelOp> kernels() const override {
    return {KernelOp::layernorm_forward, KernelOp::layernorm_backward};
  }
  bool can_assign_input_grad(size_t index) const override { return index == 0; }
  bool accepts_half_input(size_t index) const override { return index == 0; }
  bool backward_reads_input(size_t index) const override { return index < 2; }   // x and weight
  bool backward_reads_output(size_t index) const override { return index > 0; }  // mean, rstd
};

}  // namespace

const OpDef& layernorm_op() {
  static LayerNormOp op;
  return op;
}

}  // namespace paraflow::graph
