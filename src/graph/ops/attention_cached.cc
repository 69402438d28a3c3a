// attention_cached: causal attention for generation, reading and extending a KV cache.
// inputs: qkv (B,Tn,3C), k_cache (B,NH,max_T,hs) state, v_cache (same) state, position (1) i32
// attributes: n_head, scale (float, as attention's). outputs: out (B,Tn,C). Inference only: it
// has no backward.
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class AttentionCachedOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 4, "attention_cached: expected 4 inputs, got {}", in.size());
    const Shape &qkv = in[0]->shape, &cache = in[1]->shape;
    int64_t NH = attributes.get("n_head");
    attributes.get_float("scale");
    expect_shape(qkv.rank() == 3 && qkv[2] % 3 == 0, "attention_cached", "qkv must be (B,Tn,3C)", qkv);
    int64_t C = qkv[2] / 3;
    expect_shape(NH > 0 && C % NH == 0 && cache == Shape{qkv[0], NH, cache[2], C / NH} && in[2]->shape == cache,
                 "attention_cached", "caches must be (B,NH,max_T,hs)", cache);
    expect_shape(in[3]->shape == Shape{1} && in[3]->dtype == DType::i32, "attention_cached", "position must be (1) i32",
                 in[3]->shape);
    return {{"", Shape{qkv[0], qkv[1], C}, DType::f32, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    const int64_t new_positions = t.inputs[0].shape()[1];
    const int64_t past = t.inputs[3].data<int32_t>()[0];
    const int64_t max_T = t.inputs[1].shape()[2];
    check(past >= 0 && past + new_positions <= max_T, "attention_cached: positions [{}, {}) exceed the cache of {}",
          past, past + new_positions, max_T);
    backend.launch(AttentionCachedForward{.out = t.outputs[0],
                                          .qkv = t.inputs[0],
                                          .k_cache = t.inputs[1],
                                          .v_cache = t.inputs[2],
                                          .n_head = attributes.get("n_head"),
                                          .scale = static_cast<float>(attributes.get_float("scale")),
                                          .past = past});
  }

  void backward(Backend&, const NodeTensors&, const Attributes&) const override {
    throw Error("attention_cached has no backward: it is for generation only");
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::attention_cached_forward}; }
  bool host_memory_input(size_t index) const override { return index == 3; }  // the first position
  bool differentiable_input(size_t) const override { return false; }
};

}  // namespace

const OpDef& attention_cached_op() {
  static AttentionCachedOp op;
  return op;
}

}  // namespace paraflow::graph
