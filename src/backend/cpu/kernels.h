// CPU kernels: one function per kernel of backend/kernel_args.h (a template over the storage
// type where a kernel reads and writes f32, bf16 or f16 alike), registered by cpu_backend.cc.
// OpenMP-parallel with static schedules so every reduction happens in the same order on every
// run (deterministic for a fixed thread count).
#pragma once

#include <cstdint>

#include "backend/kernel_args.h"

namespace paraflow::cpu {

// A kernel argument's memory as T*, or null for an undefined (not wanted) tensor.
template <typename T>
T* pointer(const Tensor& tensor) {
  return tensor.defined() ? tensor.device_data<T>() : nullptr;
}

void embedding_forward(const EmbeddingForward& args);
void embedding_backward(const EmbeddingBackward& args);

template <typename T>
void layernorm_forward(const LayernormForward& args);
template <typename T>
void layernorm_backward(const LayernormBackward& args);

template <typename T>
void rmsnorm_forward(const RmsnormForward& args);
template <typename T>
void rmsnorm_backward(const RmsnormBackward& args);
template <typename T>
void rope_forward(const RopeForward& args);
template <typename T>
void rope_backward(const RopeBackward& args);
template <typename T>
void swiglu_forward(const SwigluForward& args);
template <typename T>
void swiglu_backward(const SwigluBackward& args);

void matmul_forward(const MatmulForward& args);
void matmul_backward(const MatmulBackward& args);
void matmul_forward_bf16(const MatmulForward& args);
// f32 rows times block-quantized weights (BlockQ8_0, BlockQ4_K or BlockQ5_0) stored [out, in] (decoding's;
// forward only).
template <typename Block>
void matmul_forward_blocks(const MatmulForward& args);
void matmul_backward_bf16(const MatmulBackward& args);

void attention_forward(const AttentionForward& args);
void attention_backward(const AttentionBackward& args);
void attention_forward_bf16(const AttentionForward& args);
void attention_backward_bf16(const AttentionBackward& args);
void attention_cached_forward(const AttentionCachedForward& args);
void attention_paged_forward(const AttentionPagedForward& args);

template <typename T>
void add_forward(const AddForward& args);
template <typename T>
void add_backward(const AddBackward& args);

void softmax_xent_forward(const SoftmaxXentForward& args);
void softmax_xent_backward(const SoftmaxXentBackward& args);
void xent_row_max(const XentRowMax& args);
void xent_sum_exp(const XentSumExp& args);
void xent_finish(const XentFinish& args);

void cast(const Cast& args);

void sum_squares(const SumSquares& args);
void adamw_update(const AdamWUpdate& args);

}  // namespace paraflow::cpu
