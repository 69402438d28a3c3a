// The Backend interface: memory, synchronisation and one kernel per layer-level op, forward and
// backward side by side. Kernels take raw device pointers with shapes in the comments, as llm.c
// does; graph ops own the shape checks, backends own only the arithmetic.
//
// Conventions: row-major; N = rows (B*T). Backward kernels ACCUMULATE (+=) into parameter
// gradients, so a weight used twice (the tied embedding) needs no add op. Gradients of
// activations are accumulated or assigned as the `accumulate_*` flag says: the executor lets the
// first writer of a gradient assign it, which saves zeroing it beforehand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow {

// How a matmul's weight is laid out. Linear layers store [in, out] (Hugging Face's Conv1D);
// the tied language-model head reuses the embedding table, which is [out, in].
enum class WeightLayout : uint8_t { in_out, out_in };

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;

  // ---- memory ----
  virtual Tensor empty(Shape shape, DType dtype) = 0;  // zero-filled
  virtual void copy(const Tensor& from, const Tensor& to) = 0;  // same shape, any devices
  virtual void fill_zero(const Tensor& tensor) = 0;
  virtual void synchronize() = 0;

  // ---- token + position embedding ----
  // out (N=B*T, C) = wte[tokens[b,t]] + wpe[position0 + t]; tokens (B,T) i32; wte (V,C); wpe (maxT,C)
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                                 int64_t T, int64_t C, int64_t position0) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                                  int64_t T, int64_t C) = 0;

  // ---- layernorm over the last axis ----
  // out (N,C); mean, rstd (N) saved for backward. inp, out, dinp and dout have element type
  // `dtype` (f32, bf16 or f16: the mixed-precision policies' storage); the rest are f32.
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* weight,
                                 const float* bias, int64_t N, int64_t C, float eps, DType dtype) = 0;
  virtual void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                                  const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                                  bool accumulate_dinp, DType dtype) = 0;

  // ---- matmul: out (N,OC) = inp (N,C) · W + bias, optionally followed by GELU (tanh form) ----
  // With gelu, `pre` (N,OC) keeps the pre-activation for backward; bias may be null.
  virtual void matmul_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias,
                              int64_t N, int64_t C, int64_t OC, WeightLayout layout, bool gelu) = 0;
  // With gelu, `dout` is overwritten with the pre-activation gradient (it is not used again).
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, float* dout, const float* inp,
                               const float* weight, const float* pre, int64_t N, int64_t C, int64_t OC,
                               WeightLayout layout, bool gelu, bool accumulate_dinp) = 0;

  // ---- causal multi-head self-attention ----
  // qkv (B,T,3C) holds q,k,v for NH heads of C/NH; out (B,T,C); probs (B,NH,T,T) saved.
  // probs = softmax(scale * q·k^T) over the causal keys; GPT-2's scale is 1/sqrt(C/NH).
  virtual void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t NH, float scale) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int64_t B,
                                  int64_t T, int64_t C, int64_t NH, float scale, bool accumulate_dqkv) = 0;

  // Generation with a KV cache: qkv (B,Tn,3C) holds Tn new positions starting at `past`; their
  // k and v are stored into k_cache, v_cache (B,NH,max_T,hs) at [past, past+Tn), then new
  // position t attends causally over cached positions [0, past+t]. out (B,Tn,C).
  virtual void attention_cached_forward(float* out, const float* qkv, float* k_cache, float* v_cache, int64_t B,
                                        int64_t Tn, int64_t C, int64_t NH, float scale, int64_t past,
                                        int64_t max_T) = 0;

  // ---- residual: out = a + b, all of element type `dtype` (f32, bf16 or f16) ----
  virtual void add_forward(void* out, const void* a, const void* b, int64_t n, DType dtype) = 0;
  // da (+)= dout; db (+)= dout
  virtual void add_backward(void* da, void* db, const void* dout, int64_t n, bool accumulate_a, bool accumulate_b,
                            DType dtype) = 0;

  // ---- softmax cross-entropy fused over the vocabulary ----
  // logits (N,V) -> losses (N) and stats (N,2) = (row max, log-sum-exp) saved for backward, so
  // the probabilities are never stored; targets (N) i32, a negative target is ignored.
  virtual void softmax_xent_forward(float* losses, float* stats, const float* logits, const int32_t* targets,
                                    int64_t N, int64_t V) = 0;
  // dlogits (+)= (softmax(logits) - onehot(target)) * dlosses[n]
  virtual void softmax_xent_backward(float* dlogits, const float* logits, const float* stats, const int32_t* targets,
                                     const float* dlosses, int64_t N, int64_t V, bool accumulate) = 0;

  // ---- precision ----
  // dst (+)= convert(src) for n elements between f32, bf16 and f16 (round to nearest even; f16
  // overflows to inf). With accumulate, the sum is formed in f32 and rounded once to dst's type.
  virtual void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, bool accumulate) = 0;

  // ---- optimizer ----
  // Sum of squares of `n` values, accumulated in double.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  virtual void scale(float* x, float factor, int64_t n) = 0;
  // Decoupled weight decay (torch.optim.AdamW's update order); grad is read, m and v updated.
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                            const AdamWParams& params) = 0;
};

// The CPU backend always exists; CUDA is listed when built with nvcc and a GPU is present.
Backend& cpu_backend();
std::vector<Backend*> available_backends();

}  // namespace paraflow
