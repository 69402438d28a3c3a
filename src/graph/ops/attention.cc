// attention: causal multi-head self-attention over a fused qkv projection.
// inputs: qkv (B,T,3C); attributes: n_head, scale (float: scores are scale * q·k^T)
// outputs: out (B,T,C); saved logsumexp (B,NH,T): each row's log-sum-exp of its scores, from
// which backward recomputes the probabilities
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class AttentionOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 1, "attention: expected 1 input, got {}", in.size());
    const Shape& qkv = in[0]->shape;
    int64_t NH = attributes.get("n_head");
    attributes.get_float("scale");
    expect_shape(qkv.rank() == 3 && qkv[2] % 3 == 0, "attention", "qkv must be (B,T,3C)", qkv);
    int64_t C = qkv[2] / 3;
    expect_shape(NH > 0 && C % NH == 0, "attention", fmt::format("C must be a multiple of n_head={}", NH), qkv);
    return {{"", Shape{qkv[0], qkv[1], C}, DType::f32, ValueRole::activation},
            {".logsumexp", Shape{qkv[0], NH, qkv[1]}, DType::f32, ValueRole::saved}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(AttentionForward{.out = t.outputs[0],
                                    .logsumexp = t.outputs[1],
                                    .qkv = t.inputs[0],
                                    .n_head = attributes.get("n_head"),
                                    .scale = static_cast<float>(attributes.get_float("scale"))});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(AttentionBackward{.dqkv = t.input_grads[0],
                                     .dout = t.output_grads[0],
                                     .qkv = t.inputs[0],
                                     .logsumexp = t.outputs[1],
                                     .n_head = attributes.get("n_head"),
                                     .scale = static_cast<float>(attributes.get_float("scale")),
                                     .accumulate_dqkv = t.accumulate[0]});
  }

  std::vector<KernelOp> kernels() const override {
    return {KernelOp::attention_forward, KernelOp::attention_backward};
  }
  bool can_assign_input_grad(size_t index) const override { return index == 0; }
  bool accepts_half_input(size_t) const override { return true; }  // where the backend has the kernels
  bool backward_reads_output(size_t index) const override { return index == 1; }  // logsumexp
};

}  // namespace

const OpDef& attention_op() {
  static AttentionOp op;
  return op;
}

}  // namespace paraflow::graph
