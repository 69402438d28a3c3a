// embedding: out (B,T,C) = wte[tokens] + wpe[position], or wte[tokens] alone for a model without
// a position table (rotary embeddings).
// inputs: tokens (B,T) i32, wte (V,C) [, wpe (P,C) [, positions i32 for cached decoding: (1), the
// first position (row t at position0 + t), or (B*T), each row's own (a ragged batch)]]
// attributes (a vocabulary-parallel shard, whose outputs are summed over the shards):
// vocab_begin, the token id of wte's first row (other tokens add nothing); add_positions 0 on
// all shards but one. layout: out_in_interleaved where decoding stores wte so (forward only).
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

// The attribute `layout` out_in_interleaved: wte stored so for a decoding graph's head.
bool interleaved(const Attributes& attributes) {
  return attributes.get("layout", 0) == static_cast<int64_t>(WeightLayout::out_in_interleaved);
}

class EmbeddingOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    check(in.size() >= 2 && in.size() <= 4, "embedding: expected 2 to 4 inputs, got {}", in.size());
    const Shape &tokens = in[0]->shape, &wte = in[1]->shape;
    expect_shape(tokens.rank() == 2 && in[0]->dtype == DType::i32, "embedding", "tokens must be (B,T) i32", tokens);
    expect_shape(wte.rank() == 2, "embedding", "wte must be (V,C)", wte);
    if (in.size() == 2) return {{"", Shape{tokens[0], tokens[1], wte[1]}, DType::f32, ValueRole::activation}};
    const Shape& wpe = in[2]->shape;
    expect_shape(wpe.rank() == 2 && wpe[1] == wte[1], "embedding", "wpe must be (P,C) with wte's C", wpe);
    expect_shape(in.size() == 4 || tokens[1] <= wpe[0], "embedding", "sequence longer than the position table",
                 tokens);
    expect_shape(in.size() == 3 || (in[3]->dtype == DType::i32 && in[3]->shape.rank() == 1 &&
                                    (in[3]->shape[0] == 1 || in[3]->shape[0] == tokens.numel())),
                 "embedding", "positions must be (1) or (B*T) i32", in.size() == 4 ? in[3]->shape : tokens);
    return {{"", Shape{tokens[0], tokens[1], wte[1]}, DType::f32, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    const bool has_table = t.inputs.size() > 2;
    EmbeddingForward args{.out = t.outputs[0],
                          .tokens = t.inputs[0],
                          .wte = t.inputs[1],
                          .wpe = has_table ? t.inputs[2] : Tensor(),
                          .vocab_begin = attributes.get("vocab_begin", 0),
                          .add_positions = has_table && attributes.get("add_positions", 1) != 0,
                          .wte_interleaved = interleaved(attributes)};
    if (!has_table) {
      backend.launch(args);
      return;
    }
    const int64_t table = t.inputs[2].shape()[0], rows = t.inputs[0].numel();
    if (t.inputs.size() == 4 && t.inputs[3].numel() == rows && rows > 1) {
      args.positions = t.inputs[3];
      const int32_t* positions = args.positions.data<int32_t>();
      for (int64_t row = 0; row < rows; ++row) {
        check(positions[row] >= 0 && positions[row] < table, "embedding: row {} has position {}, outside the position table of {}",
              row, positions[row], table);
      }
    } else {
      args.position0 = t.inputs.size() == 4 ? t.inputs[3].data<int32_t>()[0] : 0;
      check(args.position0 >= 0 && args.position0 + t.inputs[0].shape()[1] <= table,
            "embedding: positions [{}, {}) exceed the position table of {}", args.position0,
            args.position0 + t.inputs[0].shape()[1], table);
    }
    backend.launch(args);
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    check(!interleaved(attributes), "embedding backward: an out_in_interleaved wte is for decoding (forward only)");
    check(t.inputs.size() <= 3, "embedding backward: a positions input is for decoding (forward only); training "
                                "rows take positions 0..T-1");
    const bool has_table = t.inputs.size() == 3;
    backend.launch(EmbeddingBackward{.dwte = t.input_grads[1],
                                     .dwpe = has_table ? t.input_grads[2] : Tensor(),
                                     .dout = t.output_grads[0],
                                     .tokens = t.inputs[0],
                                     .vocab_begin = attributes.get("vocab_begin", 0),
                                     .add_positions = has_table && attributes.get("add_positions", 1) != 0});
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
