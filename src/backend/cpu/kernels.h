// CPU kernels: free functions, OpenMP-parallel with static schedules so every reduction happens
// in the same order on every run (deterministic for a fixed thread count). Shapes as in
// backend/backend.h.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace paraflow::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, int64_t position0);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C);

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* weight, const float* bias,
                       int64_t N, int64_t C, float eps, DType dtype);
void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dinp, DType dtype);

void matmul_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t C, int64_t OC, WeightLayout layout, bool gelu);
void matmul_backward(float* dinp, float* dweight, float* dbias, float* dout, const float* inp, const float* weight,
                     const float* pre, int64_t N, int64_t C, int64_t OC, WeightLayout layout, bool gelu,
                     bool accumulate_dinp);

void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                       float scale);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int64_t B, int64_t T,
                        int64_t C, int64_t NH, float scale, bool accumulate_dqkv);

void attention_cached_forward(float* out, const float* qkv, float* k_cache, float* v_cache, int64_t B, int64_t Tn,
                              int64_t C, int64_t NH, float scale, int64_t past, int64_t max_T);

void add_forward(void* out, const void* a, const void* b, int64_t n, DType dtype);
void add_backward(void* da, void* db, const void* dout, int64_t n, bool accumulate_a, bool accumulate_b, DType dtype);

void softmax_xent_forward(float* losses, float* stats, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V);
void softmax_xent_backward(float* dlogits, const float* logits, const float* stats, const int32_t* targets,
                           const float* dlosses, int64_t N, int64_t V, bool accumulate);

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, bool accumulate);

double sum_squares(const float* x, int64_t n);
void scale(float* x, float factor, int64_t n);
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& params);

}  // namespace paraflow::cpu
