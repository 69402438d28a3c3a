// rope: rotary position embeddings on the q and k heads of a fused qkv (transformers' rotate_half
// form; see RopeForward in backend/kernel_args.h).
// inputs: qkv (B,T,(NH+2·KVH)·hs) [, positions i32 for decoding: (1), the first position (row t
// at position0 + t), or (B*T), each row's own (a ragged batch)]
// attributes: n_head, n_kv_head, rope_theta (float), rope_scaling (RopeScaling), and for scaling:
// rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_position (floats)
// outputs: out, qkv's shape: q and k rotated, v as it was
#include "graph/ops/ops.h"

namespace paraflow::graph {

RopeFrequencies rope_frequencies(const Attributes& attributes) {
  RopeFrequencies f{.theta = attributes.get_float("rope_theta"),
                    .scaling = static_cast<RopeScaling>(attributes.get("rope_scaling", 0))};
  if (f.scaling != RopeScaling::none) f.factor = attributes.get_float("rope_factor");
  if (f.scaling == RopeScaling::llama3) {
    f.low_freq_factor = attributes.get_float("rope_low_freq_factor");
    f.high_freq_factor = attributes.get_float("rope_high_freq_factor");
    f.original_max_position = attributes.get_float("rope_original_max_position");
  }
  return f;
}

namespace {

class RopeOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 1 || in.size() == 2, "rope: expected 1 or 2 inputs, got {}", in.size());
    const Shape& qkv = in[0]->shape;
    const int64_t NH = attributes.get("n_head"), KVH = attributes.get("n_kv_head");
    rope_frequencies(attributes);
    expect_shape(qkv.rank() == 3 && qkv_head_size(qkv, NH, KVH, "rope") % 2 == 0, "rope",
                 "qkv must be (B,T,(n_head+2*n_kv_head)*head_dim), head_dim even", qkv);
    expect_shape(in.size() == 1 || (in[1]->dtype == DType::i32 && in[1]->shape.rank() == 1 &&
                                    (in[1]->shape[0] == 1 || in[1]->shape[0] == qkv[0] * qkv[1])),
                 "rope", "positions must be (1) or (B*T) i32", in.size() == 2 ? in[1]->shape : qkv);
    return {{"", qkv, in[0]->dtype, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    RopeForward args{.out = t.outputs[0],
                     .qkv = t.inputs[0],
                     .n_head = attributes.get("n_head"),
                     .n_kv_head = attributes.get("n_kv_head"),
                     .frequencies = rope_frequencies(attributes)};
    const int64_t rows = t.inputs[0].shape()[0] * t.inputs[0].shape()[1];
    if (t.inputs.size() == 2 && t.inputs[1].numel() == rows && rows > 1) {
      args.positions = t.inputs[1];
    } else if (t.inputs.size() == 2) {
      args.position0 = t.inputs[1].data<int32_t>()[0];
    }
    backend.launch(args);
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    check(t.inputs.size() == 1, "rope backward: a positions input is for decoding (forward only); training rows take "
                                "positions 0..T-1");
    backend.launch(RopeBackward{.dqkv = t.input_grads[0],
                                .dout = t.output_grads[0],
                                .n_head = attributes.get("n_head"),
                                .n_kv_head = attributes.get("n_kv_head"),
                                .frequencies = rope_frequencies(attributes),
                                .accumulate_dqkv = t.accumulate[0]});
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::rope_forward, KernelOp::rope_backward}; }
  bool host_memory_input(size_t index) const override { return index == 1; }
  bool accepts_half_input(size_t index) const override { return index == 0; }
  bool differentiable_input(size_t index) const override { return index == 0; }
  bool can_assign_input_grad(size_t index) const override { return index == 0; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& rope_op() {
  static RopeOp op;
  return op;
}

}  // namespace paraflow::graph
