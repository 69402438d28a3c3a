// softmax_xent: per-position cross-entropy of softmax(logits) against integer targets.
// inputs: logits (B,T,V), targets (B,T) i32 (negative = ignored)
// outputs: losses (B,T); saved stats (B,T,2): row max and log-sum-exp, from which backward
// recomputes the probabilities instead of storing (B,T,V) of them
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class SoftmaxXentOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    check(in.size() == 2, "softmax_xent: expected 2 inputs, got {}", in.size());
    const Shape &logits = in[0]->shape, &targets = in[1]->shape;
    expect_shape(logits.rank() == 3, "softmax_xent", "logits must be (B,T,V)", logits);
    expect_shape(targets == Shape{logits[0], logits[1]} && in[1]->dtype == DType::i32, "softmax_xent",
                 "targets must be (B,T) i32 matching the logits", targets);
    return {{"", targets, DType::f32, ValueRole::activation},
            {".stats", Shape{logits[0], logits[1], 2}, DType::f32, ValueRole::saved}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(SoftmaxXentForward{
        .losses = t.outputs[0], .stats = t.outputs[1], .logits = t.inputs[0], .targets = t.inputs[1]});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(SoftmaxXentBackward{.dlogits = t.input_grads[0],
                                       .logits = t.inputs[0],
                                       .stats = t.outputs[1],
                                       .targets = t.inputs[1],
                                       .dlosses = t.output_grads[0],
                                       .accumulate = t.accumulate[0]});
  }

  std::vector<KernelOp> kernels() const override {
    return {KernelOp::softmax_xent_forward, KernelOp::softmax_xent_backward};
  }
  bool can_assign_input_grad(size_t index) const override { return index == 0; }
  bool backward_reads_output(size_t index) const override { return index == 1; }  // stats

  bool differentiable_input(size_t index) const override { return index == 0; }
};

}  // namespace

const OpDef& softmax_xent_op() {
  static SoftmaxXentOp op;
  return op;
}

}  // namespace paraflow::graph
