// attention: causal multi-head self-attention over a fused qkv projection.
// inputs: qkv (B,T,(NH+2·KVH)·hs); attributes: n_head, n_kv_head (grouped-query attention; absent:
// n_head, GPT-2's (B,T,3C)), scale (float: scores are scale * q·k^T)
// outputs: out (B,T,NH·hs); saved logsumexp (B,NH,T): each row's log-sum-exp of its scores, from
// which backward recomputes the probabilities
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class AttentionOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 1, "attention: expected 1 input, got {}", in.size());
    const Shape& qkv = in[0]->shape;
    const int64_t NH = attributes.get("n_head");
    attributes.get_float("scale");
    expect_shape(qkv.rank() == 3, "attention", "qkv must be (B,T,(n_head+2*n_kv_head)*head_dim)", qkv);
    const int64_t hs = qkv_head_size(qkv, NH, attributes.get("n_kv_head", NH), "attention");
    return {{"", Shape{qkv[0], qkv[1], NH * hs}, DType::f32, ValueRole::activation},
            {".logsumexp", Shape{qkv[0], NH, qkv[1]}, DType::f32, ValueRole::saved}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(AttentionForward{.out = t.outputs[0],
                                    .logsumexp = t.outputs[1],
                                    .qkv = t.inputs[0],
                                    .n_head = attributes.get("n_head"),
                                    .n_kv_head = attributes.get("n_kv_head", 0),
                                    .scale = static_cast<float>(attributes.get_float("scale"))});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    backend.launch(AttentionBackward{.dqkv = t.input_grads[0],
                                     .dout = t.output_grads[0],
                                     .qkv = t.inputs[0],
                                     .logsumexp = t.outputs[1],
                                     .n_head = attributes.get("n_head"),
                                     .n_kv_head = attributes.get("n_kv_head", 0),
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

int64_t qkv_head_size(const Shape& qkv, int64_t NH, int64_t KVH, const char* op) {
  expect_shape(NH > 0 && KVH > 0 && NH % KVH == 0 && qkv[qkv.rank() - 1] % (NH + 2 * KVH) == 0, op,
               fmt::format("qkv's last dimension must be (n_head={} + 2*n_kv_head={})*head_dim, n_kv_head dividing "
                           "n_head",
                           NH, KVH),
               qkv);
  return qkv[qkv.rank() - 1] / (NH + 2 * KVH);
}

const OpDef& attention_op() {
  static AttentionOp op;
  return op;
}

}  // namespace paraflow::graph
