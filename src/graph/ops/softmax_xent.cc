// softmax_xent: per-position cross-entropy of softmax(logits) against integer targets.
// inputs: logits (B,T,V), targets (B,T) i32 (negative = ignored)
// outputs: losses (B,T); saved stats (B,T,2): row max and log-sum-exp, from which backward
// recomputes the probabilities instead of storing (B,T,V) of them
// attributes: vocab_parallel 1 for a shard holding logits [vocab_begin, vocab_begin + V) of the
// whole vocabulary, the others on the other shards of the executor's group (two more outputs:
// the rows' maxima and partial sums between the all-reduces)
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class SoftmaxXentOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 2, "softmax_xent: expected 2 inputs, got {}", in.size());
    const Shape &logits = in[0]->shape, &targets = in[1]->shape;
    expect_shape(logits.rank() == 3, "softmax_xent", "logits must be (B,T,V)", logits);
    expect_shape(targets == Shape{logits[0], logits[1]} && in[1]->dtype == DType::i32, "softmax_xent",
                 "targets must be (B,T) i32 matching the logits", targets);
    std::vector<OutputSpec> outputs{{"", targets, DType::f32, ValueRole::activation},
                                    {".stats", Shape{logits[0], logits[1], 2}, DType::f32, ValueRole::saved}};
    if (attributes.get("vocab_parallel", 0) != 0) {
      outputs.push_back({".max", targets, DType::f32, ValueRole::activation});
      outputs.push_back({".sums", Shape{logits[0], logits[1], 2}, DType::f32, ValueRole::activation});
    }
    return outputs;
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    if (attributes.get("vocab_parallel", 0) == 0) {
      backend.launch(SoftmaxXentForward{
          .losses = t.outputs[0], .stats = t.outputs[1], .logits = t.inputs[0], .targets = t.inputs[1]});
      return;
    }
    check(t.group != nullptr, "softmax_xent: vocab_parallel needs the executor's tensor-parallel group");
    const Tensor &max = t.outputs[2], &sums = t.outputs[3];
    backend.launch(XentRowMax{.max = max, .logits = t.inputs[0]});
    t.group->all_reduce_max(max);
    backend.launch(XentSumExp{.sums = sums,
                              .logits = t.inputs[0],
                              .max = max,
                              .targets = t.inputs[1],
                              .vocab_begin = attributes.get("vocab_begin")});
    t.group->all_reduce_sum(sums);
    backend.launch(
        XentFinish{.losses = t.outputs[0], .stats = t.outputs[1], .max = max, .sums = sums, .targets = t.inputs[1]});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(SoftmaxXentBackward{.dlogits = t.input_grads[0],
                                       .logits = t.inputs[0],
                                       .stats = t.outputs[1],
                                       .targets = t.inputs[1],
                                       .dlosses = t.output_grads[0],
                                       .accumulate = t.accumulate[0],
                                       .vocab_begin = attributes.get("vocab_begin", 0)});
  }

  std::vector<KernelOp> kernels() const override {
    return {KernelOp::softmax_xent_forward, KernelOp::softmax_xent_backward, KernelOp::xent_row_max,
            KernelOp::xent_sum_exp, KernelOp::xent_finish};
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
