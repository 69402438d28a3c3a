// cast: the same values in another floating-point type (f32, bf16, f16): how the precision
// policy stores activations and weights in 16 bits. Backward casts the gradient back.
// inputs: x; attributes: dtype (DType as int); outputs: y
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class CastOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 1, "cast: expected 1 input, got {}", in.size());
    auto dtype = static_cast<DType>(attributes.get("dtype"));
    check(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "cast: unsupported target {}",
          dtype_name(dtype));
    return {{"", in[0]->shape, dtype, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(Cast{.src = t.inputs[0], .dst = t.outputs[0]});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(Cast{.src = t.output_grads[0], .dst = t.input_grads[0], .accumulate = t.accumulate[0]});
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::cast}; }
  bool can_assign_input_grad(size_t) const override { return true; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& cast_op() {
  static CastOp op;
  return op;
}

}  // namespace paraflow::graph
