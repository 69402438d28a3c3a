// The CUDA kernels' launchers: raw device pointers and sizes, so that the .cu files see neither
// Tensor nor fmt (nvcc compiles only these kernels; kernel_adaptors.cc unpacks each kernel's
// argument struct into a call here). Every launcher queues its kernels on stream() and returns;
// errors surface at the launch check or at the next synchronize. Semantics are those of the
// argument structs in backend/kernel_args.h, which the CPU kernels define.
//
// None of this has run on a GPU yet: it compiles on the CPU-only machines where it was written,
// and tests/backend/backend_ops_test.cc checks it against the CPU backend where a GPU exists.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace paraflow::cuda {

// The storage types the memory-bound kernels read and write: f32 or bf16 (2 bytes, raw bits).
enum class Element : uint8_t { f32, bf16 };

// The backend's one stream: every kernel and copy is ordered on it.
cudaStream_t stream();
// Throws paraflow::Error naming `what` when the last launch failed.
void check_launch(const char* what);

void add_forward(Element type, void* out, const void* a, const void* b, int64_t n);
// da or db may be null (no gradient wanted), or the same buffer (x + x).
void add_backward(Element type, void* da, void* db, const void* dout, int64_t n, bool accumulate_a,
                  bool accumulate_b);
// A product's finish: out (N,OC) = sums + bias (OC, f32, may be null), then GELU (tanh form) if
// asked, keeping its derivative in `slope` (may be null: not kept). sums are f32 (a scratch product,
// rounded once here) or out itself; out and slope of `out_type`.
void finish_product(const float* sums, const float* bias, bool gelu, Element out_type, void* out, void* slope,
                    int64_t N, int64_t OC);
// grad (N,OC) of grad_type = dout (of dout_type) times slope (of dout_type, may be null), and
// dbias (OC, f32, may be null) += its column sums. grad may be dout itself.
void output_gradient(Element dout_type, const void* dout, const void* slope, Element grad_type, void* grad,
                     float* dbias, int64_t N, int64_t OC);
// dst (+)= convert(src); the sum formed in f32 and rounded once.
void cast(Element src_type, const void* src, Element dst_type, void* dst, int64_t n, bool accumulate);

void layernorm_forward(Element type, void* out, float* mean, float* rstd, const void* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
void layernorm_backward(Element type, void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dinp);

// positions (B*T) in device memory, or null for position0 + t.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, const int32_t* positions,
                       int64_t position0, int64_t B, int64_t T, int64_t C, int64_t V, int64_t vocab_begin,
                       bool add_positions);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, int64_t V, int64_t vocab_begin, bool add_positions);

void softmax_xent_forward(float* losses, float* stats, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V);
void softmax_xent_backward(float* dlogits, const float* logits, const float* stats, const int32_t* targets,
                           const float* dlosses, int64_t N, int64_t V, int64_t vocab_begin, bool accumulate);

struct AttentionShape {
  int64_t B, T, n_head, n_kv_head, head_size;
  float scale;
};
void attention_forward(Element type, void* out, float* logsumexp, const void* qkv, const AttentionShape& shape);
// scratch: B*NH*T floats (each query row's sum of P·dP).
void attention_backward(Element type, void* dqkv, const void* dout, const void* qkv, const float* logsumexp,
                        float* scratch, const AttentionShape& shape, bool accumulate_dqkv);

// param_copy (bf16, may be null) receives the updated parameters.
void adamw_update(float* param, const float* grad, float* m, float* v, void* param_copy, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale);
// Sum of squares in double, into result[0]; result (device memory) holds kSumSquaresBlocks + 1
// doubles, the rest the blocks' partial sums.
constexpr int kSumSquaresBlocks = 264;
void sum_squares(const float* x, int64_t n, double* result);

}  // namespace paraflow::cuda
