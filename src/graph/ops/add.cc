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
    check(in[0]->dtype == in[1]->dtype, "add: operands are {} and {}", dtype_name(in[0]->dtype),
          dtype_name(in[1]->dtype));
    return {{"", in[0]->shape, in[0]->dtype, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(AddForward{.out = t.outputs[0], .a = t.inputs[0], .b = t.inputs[1]});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(AddBackward{.da = t.input_grads[0],
                               .db = t.input_grads[1],
                               .dout = t.output_grads[0],
                               .accumulate_a = t.accumulate[0],
                               .accumulate_b = t.accumulate[1]});
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::add_forward, KernelOp::add_backward}; }
  bool can_assign_input_grad(size_t) const override { return true; }
  bool accepts_half_input(size_t) const override { return true; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& add_op() {
  static AddOp op;
  return op;
}

}  // namespace paraflow::graph
