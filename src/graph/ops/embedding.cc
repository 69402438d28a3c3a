// embedding: out (B,T,C) = wte[tokens] + wpe[position0 + t].
// inputs: tokens (B,T) i32, wte (V,C), wpe (P,C) [, position0 (1) i32 for cached decoding]
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class EmbeddingOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    check(in.size() == 3 || in.size() == 4, "embedding: expected 3 or 4 inputs, got {}", in.size());
    const Shape &tokens = in[0]->shape, &wte = in[1]->shape, &wpe = in[2]->shape;
    expect_shape(tokens.rank() == 2 && in[0]->dtype == DType::i32, "embedding", "tokens must be (B,T) i32", tokens);
    expect_shape(wte.rank() == 2, "embedding", "wte must be (V,C)", wte);
    expect_shape(wpe.rank() == 2 && wpe[1] == wte[1], "embedding", "wpe must be (P,C) with wte's C", wpe);
    expect_shape(in.size() == 4 || tokens[1] <= wpe[0], "embedding", "sequence longer than the position table",
                 tokens);
    return {{"", Shape{tokens[0], tokens[1], wte[1]}, DType::f32, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    const int64_t position0 = t.inputs.size() == 4 ? t.inputs[3].data<int32_t>()[0] : 0;
    check(position0 >= 0 && position0 + t.inputs[0].shape()[1] <= t.inputs[2].shape()[0],
          "embedding: positions [{}, {}) exceed the position table of {}", position0,
          position0 + t.inputs[0].shape()[1], t.inputs[2].shape()[0]);
    backend.launch(EmbeddingForward{
        .out = t.outputs[0], .tokens = t.inputs[0], .wte = t.inputs[1], .wpe = t.inputs[2], .position0 = position0});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.launch(EmbeddingBackward{
        .dwte = t.input_grads[1], .dwpe = t.input_grads[2], .dout = t.output_grads[0], .tokens = t.inputs[0]});
  }

  std::vector<KernelOp> kernels() const override {
    return {KernelOp::embedding_forward, KernelOp::embedding_backward};
  }
  bool host_memory_input(size_t index) const override { return index == 3; }  // the first position
  bool differentiable_input(size_t index) const override { return index == 1 || index == 2; }
  bool backward_reads_input(size_t index) const override { return index == 0; }  // the token ids
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& embedding_op() {
  static EmbeddingOp op;
  return op;
}

}  // namespace paraflow::graph
