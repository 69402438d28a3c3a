// What each kernel is given: one argument struct per kernel, holding tensors (in the backend's
// memory) and scalars. A backend runs a kernel registered for (kernel, its device, the struct's
// dtype()); graph ops own the shape checks, kernels own only the arithmetic.
//
// Conventions: row-major; N = rows (B*T). Backward kernels ACCUMULATE (+=) into parameter
// gradients, so a weight used twice (the tied embedding) needs no add op. Gradients of
// activations are accumulated or assigned as the `accumulate_*` flag says: the executor lets the
// first writer of a gradient assign it, which saves zeroing it beforehand. An undefined Tensor
// means "not wanted" where a comment says it may be.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow {

// The kernel list, written once: the enum, the names and the registry are expanded from it.
#define PARAFLOW_KERNELS(X)                                                                          \
  X(embedding_forward) X(embedding_backward) X(layernorm_forward) X(layernorm_backward)              \
  X(rmsnorm_forward) X(rmsnorm_backward) X(rope_forward) X(rope_backward)                            \
  X(swiglu_forward) X(swiglu_backward)                                                               \
  X(matmul_forward) X(matmul_backward) X(attention_forward) X(attention_backward)                    \
  X(attention_cached_forward) X(attention_paged_forward) X(add_forward) X(add_backward)              \
  X(softmax_xent_forward) X(softmax_xent_backward) X(xent_row_max) X(xent_sum_exp) X(xent_finish)    \
  X(cast) X(sum_squares) X(adamw_update)

#define PARAFLOW_KERNEL_ENUMERATOR(name) name,
enum class KernelOp : uint8_t { PARAFLOW_KERNELS(PARAFLOW_KERNEL_ENUMERATOR) };
#undef PARAFLOW_KERNEL_ENUMERATOR

const char* kernel_op_name(KernelOp op);
// A gradient's kernel (named *_backward): only training launches it.
bool is_backward_kernel(KernelOp op);

// How a matmul's weight is laid out. Linear layers store [in, out] (Hugging Face's Conv1D);
// the tied language-model head reuses the embedding table, which is [out, in]. Decoding may store
// an [out, in] weight out_in_interleaved (see interleaved_offset), for kernels that read
// kInterleavedRows rows at once, or out_in_tiles (see tiles_offset), for AMX's tile products.
enum class WeightLayout : uint8_t { in_out, out_in, out_in_interleaved, out_in_tiles };
const char* weight_layout_name(WeightLayout layout);

// out_in_interleaved: the [rows, columns] weight's rows in groups of kInterleavedRows, each group
// stored column by column (the group's 16 values of column 0, then of column 1, ...); rows after
// the last whole group stay as in out_in. A group is a panel of the [in, out] matrix: the kernel
// multiplies a few input rows by it as outer products, a broadcast input value times 16 weights,
// summing each output over the columns in order, and reads each panel as one contiguous stream.
// That needs about half the loads of dot products of [out, in] rows (GPT-2 124M's 768 x 3072
// matmul at 8-64 rows on an AVX2 EPYC: 1.1-1.6x in one run, up to 2x across runs; RESULTS.md).
constexpr int64_t kInterleavedRows = 16;
// Where element (row, column) of an out_in_interleaved weight lies.
inline int64_t interleaved_offset(int64_t row, int64_t column, int64_t rows, int64_t columns) {
  if (row >= rows / kInterleavedRows * kInterleavedRows) return row * columns + column;
  return row / kInterleavedRows * kInterleavedRows * columns + column * kInterleavedRows + row % kInterleavedRows;
}
// The distance between consecutive columns of one row of an out_in_interleaved weight.
inline int64_t interleaved_column_stride(int64_t row, int64_t rows) {
  return row < rows / kInterleavedRows * kInterleavedRows ? kInterleavedRows : 1;
}

// out_in_tiles: the [rows, columns] weight's rows in groups of 16, each group stored as AMX's
// B tiles want it: per pair of columns, the group's 16 rows' two values side by side (column 2p
// of row r at 32p + 2r + 0, column 2p + 1 at + 1); rows after the last whole group stay as in
// out_in. Each 32 columns of a group are then one contiguous 1 KiB tile, and a group one stream.
// The input rows become A tiles as they are and the product tile is [input row][output], so
// neither side is repacked per call (the [out, in] rows this replaced took the weight as A, the
// inputs repacked into B, and a transpose of every product: on an AMX Xeon, GPT-2 124M's shape,
// a step of 32 decoding sequences 1.15x and batch-1 decoding 1.05x; RESULTS.md). Columns a
// multiple of 32 for AMX. float16 weights take the same layout for the half products
// (backend/cpu/half_products.h): a column pair of a group is one 32-lane register, multiplied by
// a broadcast pair of input values; there the columns need only be even.
inline int64_t tiles_offset(int64_t row, int64_t column, int64_t rows, int64_t columns) {
  if (row >= rows / 16 * 16) return row * columns + column;
  return row / 16 * 16 * columns + column / 2 * 32 + row % 16 * 2 + column % 2;
}

// ---- token + position embedding ----
// out (N=B*T, C) = wte[tokens[b,t]] + wpe[position of row b,t]; tokens (B,T) i32; wte (V,C);
// wpe (maxT,C). The position is positions[b*T + t] when `positions` (B*T, i32, host memory) is
// given (a ragged batch of many sequences), else position0 + t.
// A vocabulary-parallel shard's wte holds rows [vocab_begin, vocab_begin + V): other tokens add
// nothing; without add_positions, neither does wpe (one shard adds it), which may then be
// undefined (a model without a position table).
struct EmbeddingForward {
  static constexpr KernelOp op = KernelOp::embedding_forward;
  Tensor out, tokens, wte, wpe;
  int64_t position0 = 0;
  Tensor positions;
  int64_t vocab_begin = 0;
  bool add_positions = true;
  // wte stored out_in_interleaved (a decoding graph's head reads it so): a row is then a column
  // of its group, read with a stride of kInterleavedRows. Forward only.
  bool wte_interleaved = false;
  DType dtype() const { return wte.dtype(); }
};
struct EmbeddingBackward {
  static constexpr KernelOp op = KernelOp::embedding_backward;
  Tensor dwte, dwpe, dout, tokens;
  int64_t vocab_begin = 0;
  bool add_positions = true;
  DType dtype() const { return dwte.dtype(); }
};

// ---- layernorm over the last axis ----
// out (N,C); mean, rstd (N) f32, saved for backward; weight, bias (C) f32. inp, out, dinp and dout
// share the storage type dtype() (f32, bf16 or f16: the mixed-precision policies').
struct LayernormForward {
  static constexpr KernelOp op = KernelOp::layernorm_forward;
  Tensor out, mean, rstd, inp, weight, bias;
  float eps = 1e-5f;
  DType dtype() const { return inp.dtype(); }
};
struct LayernormBackward {
  static constexpr KernelOp op = KernelOp::layernorm_backward;
  Tensor dinp, dweight, dbias, dout, inp, weight, mean, rstd;
  bool accumulate_dinp = false;
  DType dtype() const { return inp.dtype(); }
};

// ---- RMSNorm over the last axis (Llama's): out = x * rstd * weight, rstd = 1/sqrt(mean(x²) + eps) ----
// out (N,C), rstd (N) f32 saved for backward, weight (C) f32; inp, out, dinp and dout share the
// storage type dtype() (f32, bf16 or f16: the mixed-precision policies').
struct RmsnormForward {
  static constexpr KernelOp op = KernelOp::rmsnorm_forward;
  Tensor out, rstd, inp, weight;
  float eps = 1e-6f;
  DType dtype() const { return inp.dtype(); }
};
struct RmsnormBackward {
  static constexpr KernelOp op = KernelOp::rmsnorm_backward;
  Tensor dinp, dweight, dout, inp, weight, rstd;
  bool accumulate_dinp = false;
  DType dtype() const { return inp.dtype(); }
};

// ---- rotary position embeddings (RoPE), transformers' rotate_half form ----
// How the inverse frequencies are made (transformers' ROPE_INIT_FUNCTIONS): default
// 1/theta^(2i/hs); linear divides them by `factor`; llama3 divides the low frequencies by
// `factor`, keeps the high ones and blends those between (_compute_llama3_parameters).
enum class RopeScaling : uint8_t { none, linear, llama3 };
struct RopeFrequencies {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_position = 8192;                   // llama3
};
// The hs/2 inverse frequencies, computed in float32 step by step as transformers does.
std::vector<float> rope_inverse_frequencies(const RopeFrequencies& frequencies, int64_t head_size);

// qkv (B,T,(NH+2·KVH)·hs): q's NH heads, then k's KVH heads, then v's. out has qkv's shape: q and
// k heads rotated, v copied. Within a head, element i < hs/2 pairs with i + hs/2:
// (x_i, x_{i+hs/2}) -> (x_i cos - x_{i+hs/2} sin, x_{i+hs/2} cos + x_i sin), the angle being
// position · inv_freq[i]. The position is positions[b*T + t] when `positions` (B*T, i32, host
// memory) is given, else position0 + t. out and qkv (dqkv and dout) share the storage type dtype()
// (f32, bf16 or f16), the rotation computed in f32.
struct RopeForward {
  static constexpr KernelOp op = KernelOp::rope_forward;
  Tensor out, qkv;
  int64_t n_head = 1, n_kv_head = 1;
  RopeFrequencies frequencies;
  int64_t position0 = 0;
  Tensor positions;
  DType dtype() const { return qkv.dtype(); }
};
// dqkv (+)= the inverse rotation of dout (positions 0..T-1).
struct RopeBackward {
  static constexpr KernelOp op = KernelOp::rope_backward;
  Tensor dqkv, dout;
  int64_t n_head = 1, n_kv_head = 1;
  RopeFrequencies frequencies;
  bool accumulate_dqkv = false;
  DType dtype() const { return dout.dtype(); }
};

// ---- SwiGLU: out = silu(gate) * up, silu(x) = x / (1 + exp(-x)); all (N,F) of one storage type
// dtype() (f32, bf16 or f16), computed in f32 ----
struct SwigluForward {
  static constexpr KernelOp op = KernelOp::swiglu_forward;
  Tensor out, gate, up;
  DType dtype() const { return gate.dtype(); }
};
struct SwigluBackward {
  static constexpr KernelOp op = KernelOp::swiglu_backward;
  Tensor dgate, dup, dout, gate, up;
  bool accumulate_gate = false, accumulate_up = false;
  DType dtype() const { return gate.dtype(); }
};

// ---- matmul: out (N,OC) = inp (N,C) · W + bias, optionally followed by GELU (tanh form) ----
// W is [C,OC] (in_out) or [OC,C] (out_in, or out_in_interleaved and out_in_tiles: forward only); bias (OC) f32
// may be undefined. With gelu, `gelu_slope` (N,OC) keeps GELU's derivative at the pre-activation,
// all that backward needs of it (undefined where no backward runs: it is then not computed).
// dtype() is the operands' type (inp and weight); out is f32 or that type, and gelu_slope has
// out's type. f32 rows may also multiply a float16 weight (decoding's, [out, in], forward only):
// out_in_tiles in half arithmetic where the CPU has it (backend/cpu/half_products.h), out_in
// widened to f32; or a block-quantized weight (q8_0, q4_k, q5_0; [out, in], forward only), whose type is then
// dtype(): its kernel is registered under it.
struct MatmulForward {
  static constexpr KernelOp op = KernelOp::matmul_forward;
  Tensor out, gelu_slope, inp, weight, bias;
  WeightLayout layout = WeightLayout::in_out;
  bool gelu = false;
  // Each output row computed by the same instructions whatever the number of rows (serving: a
  // request's tokens do not depend on what it is batched with); the GEMM libraries' blocking
  // changes with the batch, and with it the rounding.
  bool row_invariant = false;
  DType dtype() const { return is_block_quantized(weight.dtype()) ? weight.dtype() : inp.dtype(); }
};
// dinp (N,C) (+)= dout · W^T (dinp may be undefined); dweight (+)= inp^T · dout (or its
// transpose); dbias += column sums of dout (may be undefined). Gradients have their values'
// types (f32, or bf16 for bf16 operands); dbias is f32. An f32 dout is overwritten, with gelu,
// by the pre-activation gradient (it is not used again).
struct MatmulBackward {
  static constexpr KernelOp op = KernelOp::matmul_backward;
  Tensor dinp, dweight, dbias, dout, inp, weight, gelu_slope;
  WeightLayout layout = WeightLayout::in_out;
  bool gelu = false;
  bool accumulate_dinp = false, accumulate_dweight = true;
  DType dtype() const { return inp.dtype(); }
};

// ---- causal multi-head self-attention ----
// Kernels work through the queries in blocks of kAttentionBlockRows rows; the CPU's keeps one
// block's probabilities (and their gradients) per thread, which the memory report counts.
constexpr int64_t kAttentionBlockRows = 64;

// qkv (B,T,(NH+2·KVH)·hs) holds q for n_head heads of hs, then k and v for n_kv_head heads each
// (grouped-query attention: q head h reads k/v head h / (NH/KVH); n_kv_head 0 means n_head, and
// GPT-2's qkv is then (B,T,3C), hs = C/NH); out (B,T,NH·hs); logsumexp (B,NH,T) saved.
// out = softmax(scale * q·k^T) · v over the causal keys; GPT-2's scale is 1/sqrt(hs).
// logsumexp holds each row's log(sum(exp(scores))), from which backward recomputes the
// probabilities (no (B,NH,T,T) tensor).
struct AttentionForward {
  static constexpr KernelOp op = KernelOp::attention_forward;
  Tensor out, logsumexp, qkv;
  int64_t n_head = 1, n_kv_head = 0;
  float scale = 1.0f;
  DType dtype() const { return qkv.dtype(); }
};
struct AttentionBackward {
  static constexpr KernelOp op = KernelOp::attention_backward;
  Tensor dqkv, dout, qkv, logsumexp;
  int64_t n_head = 1, n_kv_head = 0;
  float scale = 1.0f;
  bool accumulate_dqkv = false;
  DType dtype() const { return qkv.dtype(); }
};

// Generation with a KV cache: qkv (B,Tn,(NH+2·KVH)·hs), laid out as attention's, holds Tn new
// positions starting at `past`; their k and v are stored into k_cache, v_cache (B,KVH,max_T,hs)
// at [past, past+Tn), then new position t attends causally over cached positions [0, past+t].
// out (B,Tn,NH·hs).
struct AttentionCachedForward {
  static constexpr KernelOp op = KernelOp::attention_cached_forward;
  Tensor out, qkv, k_cache, v_cache;
  int64_t n_head = 1, n_kv_head = 0;
  float scale = 1.0f;
  int64_t past = 0;
  DType dtype() const { return qkv.dtype(); }
};

// ---- attention of a ragged batch over a paged KV cache (serving) ----
// qkv (N,1,(NH+2·KVH)·hs) laid out as attention's; out (N,1,NH·hs); k_pool, v_pool
// (blocks, KVH, block_size, hs), both f32 or both bf16
// (keys and values rounded to bf16 as they are stored, widened as they are read); positions (N) and
// block_tables (N, max_blocks) i32 in host memory. Token i stores its key and value at position
// p = positions[i] of its sequence (block block_tables[i][p / block_size], slot p % block_size),
// then attends to positions 0..p, keys stored by earlier tokens of the same batch included.
struct AttentionPagedForward {
  static constexpr KernelOp op = KernelOp::attention_paged_forward;
  Tensor out, qkv, k_pool, v_pool, positions, block_tables;
  int64_t n_head = 1, n_kv_head = 0;
  float scale = 1.0f;
  DType dtype() const { return qkv.dtype(); }
};

// ---- residual: out = a + b, all of one storage type (f32, bf16 or f16) ----
struct AddForward {
  static constexpr KernelOp op = KernelOp::add_forward;
  Tensor out, a, b;
  DType dtype() const { return out.dtype(); }
};
// da (+)= dout; db (+)= dout
struct AddBackward {
  static constexpr KernelOp op = KernelOp::add_backward;
  Tensor da, db, dout;
  bool accumulate_a = false, accumulate_b = false;
  DType dtype() const { return dout.dtype(); }
};

// ---- softmax cross-entropy fused over the vocabulary ----
// logits (N,V) -> losses (N) and stats (N,2) = (row max, log-sum-exp) saved for backward, so
// the probabilities are never stored; targets (N) i32, a negative target is ignored.
struct SoftmaxXentForward {
  static constexpr KernelOp op = KernelOp::softmax_xent_forward;
  Tensor losses, stats, logits, targets;
  DType dtype() const { return logits.dtype(); }
};
// dlogits (+)= (softmax(logits) - onehot(target)) * dlosses[n]; for a vocabulary shard, logits
// are columns [vocab_begin, vocab_begin + V) and stats the whole vocabulary's.
struct SoftmaxXentBackward {
  static constexpr KernelOp op = KernelOp::softmax_xent_backward;
  Tensor dlogits, logits, stats, targets, dlosses;
  bool accumulate = false;
  int64_t vocab_begin = 0;
  DType dtype() const { return logits.dtype(); }
};
// The same loss when each shard holds logits [vocab_begin, vocab_begin + V) of every row (no rank
// holds them all): the row maxima (max over the shards), then per row the sum of exp(x - max)
// and the target's logit if this shard has it (both summed over the shards), then the losses
// and the stats backward reads.
struct XentRowMax {
  static constexpr KernelOp op = KernelOp::xent_row_max;
  Tensor max, logits;  // max (N)
  DType dtype() const { return logits.dtype(); }
};
struct XentSumExp {
  static constexpr KernelOp op = KernelOp::xent_sum_exp;
  Tensor sums, logits, max, targets;  // sums (N,2): sum of exp(x - max), the target's logit or 0
  int64_t vocab_begin = 0;
  DType dtype() const { return logits.dtype(); }
};
struct XentFinish {
  static constexpr KernelOp op = KernelOp::xent_finish;
  Tensor losses, stats, max, sums, targets;
  DType dtype() const { return losses.dtype(); }
};

// ---- precision ----
// dst (+)= convert(src), same element count, between f32, bf16 and f16 (round to nearest even;
// f16 overflows to inf). With accumulate, the sum is formed in f32 and rounded once to dst's type.
struct Cast {
  static constexpr KernelOp op = KernelOp::cast;
  Tensor src, dst;
  bool accumulate = false;
  DType dtype() const { return src.dtype(); }
};

// ---- optimizer (f32) ----
// *result = sum of squares of x, accumulated in double; result is host memory.
struct SumSquares {
  static constexpr KernelOp op = KernelOp::sum_squares;
  Tensor x;
  double* result = nullptr;
  DType dtype() const { return x.dtype(); }
};
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
  float grad_scale = 1.0f;  // each gradient is multiplied by this first (clipping, loss unscaling)
};
// Decoupled weight decay (torch.optim.AdamW's update order); grad is read, m and v updated.
// param, grad, m, v: the same element count, f32. param_copy (may be undefined), bf16 or f16,
// receives the updated parameters in the same pass: the 16-bit weights the GEMMs read.
struct AdamWUpdate {
  static constexpr KernelOp op = KernelOp::adamw_update;
  Tensor param, grad, m, v, param_copy;
  AdamWParams params{};
  DType dtype() const { return param.dtype(); }
};

}  // namespace paraflow
