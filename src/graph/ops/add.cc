// add: the residual connection, out = a + b (same shapes).
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class AddOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    check(in.size() == 2, "add: expected 2 inputs, got {}", in.size());
    expect_shape(in[0]->shape == in[1]->shape, "add", "operands must have equal shapes, b is " + in[1]->shape.to_string(),
                 in[0]->shape);
    return {{"", in[0]->shape, DType::f32, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.add_forward(t.outputs[0].data<float>(), t.inputs[0].data<float>(), t.inputs[1].data<float>(),
                        t.outputs[0].numel());
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.add_backward(t.input_grads[0].data<float>(), t.input_grads[1].data<float>(),
                         t.output_grads[0].data<float>(), t.outputs[0].numel(), t.accumulate[0], t.accumulate[1]);
  }

  bool can_assign_input_grad(size_t) const override { return true; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& add_op() {
  static AddOp op;
  return op;
}

}  // namespace paraflow::graph
