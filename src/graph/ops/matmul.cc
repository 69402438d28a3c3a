// matmul: out (...,OC) = x (...,C) · W [+ bias], optionally GELU(tanh) fused.
// inputs: x, weight ([C,OC] for layout in_out, [OC,C] for out_in, out_in_interleaved and out_in_tiles) [, bias (OC)]
// attributes: layout (WeightLayout as int), gelu (0/1), row_invariant (0/1: MatmulForward's),
//   forward_only (0/1: no backward runs, as in decoding; GELU's slope is then neither computed nor kept)
// outputs: out; with gelu (not forward_only) also GELU's derivative at the pre-activation, saved for backward
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

struct MatmulDims {
  int64_t N, C, OC;
  WeightLayout layout;
  bool gelu, keeps_slope;
};

MatmulDims dims_of(const Shape& x, const Shape& weight, const Attributes& attributes) {
  auto layout = static_cast<WeightLayout>(attributes.get("layout", 0));
  int64_t C = x[x.rank() - 1];
  int64_t OC = layout == WeightLayout::in_out ? weight[1] : weight[0];
  const bool gelu = attributes.get("gelu", 0) != 0;
  return {leading_rows(x), C, OC, layout, gelu, gelu && attributes.get("forward_only", 0) == 0};
}

class MatmulOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 2 || in.size() == 3, "matmul: expected 2 or 3 inputs, got {}", in.size());
    const Shape &x = in[0]->shape, &w = in[1]->shape;
    expect_shape(w.rank() == 2, "matmul", "weight must be 2-D", w);
    MatmulDims d = dims_of(x, w, attributes);
    int64_t weight_in = d.layout == WeightLayout::in_out ? w[0] : w[1];
    expect_shape(weight_in == d.C, "matmul", fmt::format("weight's input dimension must equal x's last ({})", d.C), w);
    if (in.size() == 3) expect_shape(in[2]->shape == Shape{d.OC}, "matmul", "bias must be (OC)", in[2]->shape);
    std::vector<int64_t> out_dims = x.dims();
    out_dims.back() = d.OC;
    std::vector<OutputSpec> outputs{{"", Shape(out_dims), DType::f32, ValueRole::activation}};
    if (d.keeps_slope) outputs.push_back({".gelu_slope", Shape(out_dims), DType::f32, ValueRole::saved});
    return outputs;
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    MatmulDims d = dims_of(t.inputs[0].shape(), t.inputs[1].shape(), attributes);
    backend.launch(MatmulForward{.out = t.outputs[0],
                                 .gelu_slope = d.keeps_slope ? t.outputs[1] : Tensor(),
                                 .inp = t.inputs[0],
                                 .weight = t.inputs[1],
                                 .bias = t.inputs.size() == 3 ? t.inputs[2] : Tensor(),
                                 .layout = d.layout,
                                 .gelu = d.gelu,
                                 .row_invariant = attributes.get("row_invariant", 0) != 0});
  }

  void backward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    MatmulDims d = dims_of(t.inputs[0].shape(), t.inputs[1].shape(), attributes);
    check(d.gelu == d.keeps_slope, "matmul: a forward_only node with GELU kept no slope for a backward pass");
    backend.launch(MatmulBackward{.dinp = t.input_grads[0],
                                  .dweight = t.input_grads[1],
                                  .dbias = t.inputs.size() == 3 ? t.input_grads[2] : Tensor(),
                                  .dout = t.output_grads[0],
                                  .inp = t.inputs[0],
                                  .weight = t.inputs[1],
                                  .gelu_slope = d.gelu ? t.outputs[1] : Tensor(),
                                  .layout = d.layout,
                                  .gelu = d.gelu,
                                  .accumulate_dinp = t.accumulate[0],
                                  .accumulate_dweight = t.accumulate[1]});
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::matmul_forward, KernelOp::matmul_backward}; }
  bool can_assign_input_grad(size_t index) const override { return index < 2; }
  // x and W: bf16 GEMMs where the backend has them (the bias stays f32).
  bool accepts_half_input(size_t index) const override { return index < 2; }
  bool output_follows_half_inputs(size_t) const override { return true; }  // out and gelu_slope
  bool backward_reads_input(size_t index) const override { return index < 2; }   // x and W, not the bias
  bool backward_reads_output(size_t index) const override { return index == 1; }  // gelu_slope, not out
};

}  // namespace

const OpDef& matmul_op() {
  static MatmulOp op;
  return op;
}

}  // namespace paraflow::graph
