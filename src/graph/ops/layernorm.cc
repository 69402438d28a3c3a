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
    const Shape& x = t.inputs[0].shape();
    backend.layernorm_forward(t.outputs[0].raw(), t.outputs[1].data<float>(), t.outputs[2].data<float>(),
                              t.inputs[0].raw(), t.inputs[1].data<float>(), t.inputs[2].data<float>(),
                              leading_rows(x), x[x.rank() - 1], static_cast<float>(attributes.get_float("eps")),
                              t.inputs[0].dtype());
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    const Shape& x = t.inputs[0].shape();
    backend.layernorm_backward(t.input_grads[0].raw(), t.input_grads[1].data<float>(), t.input_grads[2].data<float>(),
                               t.output_grads[0].raw(), t.inputs[0].raw(), t.inputs[1].data<float>(),
                               t.outputs[1].data<float>(), t.outputs[2].data<float>(), leading_rows(x),
                               x[x.rank() - 1], t.accumulate[0], t.inputs[0].dtype());
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
