// attention_paged: causal attention of a ragged batch (tokens of many sequences, each at its own
// position) over a paged KV cache, as vLLM's PagedAttention. Serving's one graph for any batch.
// inputs: qkv (N,1,(NH+2·KVH)·hs) as attention's; k_pool, v_pool (blocks, KVH, block_size, hs)
// state, both f32 or both bf16 (keys and values rounded to bf16 as they are written); positions
// (N) i32; block_tables (N, max_blocks) i32 (token i's sequence's blocks). attributes: n_head,
// n_kv_head (absent: n_head), scale. outputs: out (N,1,NH·hs). Inference only: it has no backward.
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

class AttentionPagedOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes& attributes) const override {
    check(in.size() == 5, "attention_paged: expected 5 inputs, got {}", in.size());
    const Shape &qkv = in[0]->shape, &pool = in[1]->shape, &positions = in[3]->shape, &tables = in[4]->shape;
    const int64_t NH = attributes.get("n_head"), KVH = attributes.get("n_kv_head", NH);
    attributes.get_float("scale");
    expect_shape(qkv.rank() == 3 && qkv[1] == 1, "attention_paged", "qkv must be (N,1,(n_head+2*n_kv_head)*hs)", qkv);
    const int64_t hs = qkv_head_size(qkv, NH, KVH, "attention_paged"), C = NH * hs;
    expect_shape(pool.rank() == 4 && pool[1] == KVH && pool[3] == hs && in[2]->shape == pool, "attention_paged",
                 "KV pools must be (blocks,n_kv_head,block_size,hs)", pool);
    check((in[1]->dtype == DType::f32 || in[1]->dtype == DType::bf16) && in[2]->dtype == in[1]->dtype,
          "attention_paged: KV pools must both be f32 or both bf16 (got {} and {})", dtype_name(in[1]->dtype),
          dtype_name(in[2]->dtype));
    expect_shape(positions == Shape{qkv[0]} && in[3]->dtype == DType::i32, "attention_paged",
                 "positions must be (N) i32", positions);
    expect_shape(tables.rank() == 2 && tables[0] == qkv[0] && in[4]->dtype == DType::i32, "attention_paged",
                 "block tables must be (N, max_blocks) i32", tables);
    return {{"", Shape{qkv[0], 1, C}, DType::f32, ValueRole::activation}};
  }

  void forward(Backend& backend, const NodeTensors& t, const Attributes& attributes) const override {
    // Every block a token touches must exist: a bad table would otherwise read or write anywhere.
    const Tensor &positions = t.inputs[3], &tables = t.inputs[4];
    const int64_t blocks = t.inputs[1].shape()[0], block_size = t.inputs[1].shape()[2];
    const int64_t max_blocks = tables.shape()[1];
    const int32_t* position = positions.data<int32_t>();
    const int32_t* table = tables.data<int32_t>();
    for (int64_t i = 0; i < positions.numel(); ++i) {
      check(position[i] >= 0 && position[i] < max_blocks * block_size,
            "attention_paged: token {} has position {}, beyond its block table of {} blocks of {}", i, position[i],
            max_blocks, block_size);
      for (int64_t b = 0; b <= position[i] / block_size; ++b) {
        const int32_t block = table[i * max_blocks + b];
        check(block >= 0 && block < blocks, "attention_paged: token {} maps block {} to {}, outside the pool of {}", i,
              b, block, blocks);
      }
    }
    backend.launch(AttentionPagedForward{.out = t.outputs[0],
                                         .qkv = t.inputs[0],
                                         .k_pool = t.inputs[1],
                                         .v_pool = t.inputs[2],
                                         .positions = positions,
                                         .block_tables = tables,
                                         .n_head = attributes.get("n_head"),
                                         .n_kv_head = attributes.get("n_kv_head", 0),
                                         .scale = static_cast<float>(attributes.get_float("scale"))});
  }

  void backward(Backend&, const NodeTensors&, const Attributes&) const override {
    throw Error("attention_paged has no backward: it is for serving only");
  }

  std::vector<KernelOp> kernels() const override { return {KernelOp::attention_paged_forward}; }
  bool host_memory_input(size_t index) const override { return index == 3 || index == 4; }
  bool differentiable_input(size_t) const override { return false; }
};

}  // namespace

const OpDef& attention_paged_op() {
  static AttentionPagedOp op;
  return op;
}

}  // namespace paraflow::graph
