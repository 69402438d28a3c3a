// attention_cached: causal attention for generation, reading and extending a KV cache.
// inputs: qkv (B,Tn,(NH+2·KVH)·hs) as attention's, k_cache (B,KVH,max_T,hs) state, v_cache (same)
// state, position (1) i32. attributes: n_head, n_kv_head (absent: n_head), scale (float, as
// attention's). outputs: out (B,Tn,NH·hs). Inference only: it
// has no backward.
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class AttentionCachedOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 4, "attention_cached: expected 4 inputs, got {}", in.size());
    const Shape &qkv = in[0]->shape, &cache = in[1]->shape;
    const int64_t NH = attributes.get("n_head"), KVH = attributes.get("n_kv_head", NH);
    attributes.get_float("scale");
    expect_shape(qkv.rank() == 3, "attention_cached", "qkv must be (B,Tn,(n_head+2*n_kv_head)*hs)", qkv);
    const int64_t hs = qkv_head_size(qkv, NH, KVH, "attention_cached"), C = NH * hs;
    expect_shape(cache.rank() == 4 && cache == Shape{qkv[0], KVH, cache[2], hs} && in[2]->shape == cache,
                 "attention_cached", "caches must be (B,n_kv_head,max_T,hs)", cache);
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
                                          .n_kv_head = attributes.get("n_kv_head", 0),
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
