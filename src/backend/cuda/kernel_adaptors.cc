// The CUDA kernels' registration: each kernel's argument struct unpacked into its launcher
// (kernels.h), keyed (op, cuda, dtype) as the CPU's. What the CUDA backend lacks (RMSNorm, RoPE,
// SwiGLU, the KV-cache and paged attention of decoding, the vocabulary-sharded cross-entropy,
// float16 storage) fails at launch naming kernel, device and dtype (Backend::kernel).
#include <fmt/format.h>

#include "backend/backend.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/runtime.h"
#include "base/error.h"

namespace paraflow::cuda {

namespace {

Element element_of(const Tensor& tensor, const char* kernel, const char* name) {
  if (tensor.dtype() == DType::f32) return Element::f32;
  if (tensor.dtype() == DType::bf16) return Element::bf16;
  throw Error(fmt::format("cuda {}: {} is {}; the CUDA kernels store f32 or bf16", kernel, name,
                          dtype_name(tensor.dtype())));
}

template <typename T>
T* device(const Tensor& tensor) {
  return tensor.defined() ? tensor.device_data<T>() : nullptr;
}
void* device(const Tensor& tensor) { return tensor.defined() ? tensor.device_address() : nullptr; }

int64_t last_axis(const Tensor& tensor) { return tensor.shape()[tensor.shape().rank() - 1]; }

void launch_add_forward(const AddForward& a) {
  add_forward(element_of(a.out, "add_forward", "out"), a.out.device_address(), a.a.device_address(),
              a.b.device_address(), a.out.numel());
}
void launch_add_backward(const AddBackward& a) {
  add_backward(element_of(a.dout, "add_backward", "dout"), device(a.da), device(a.db), a.dout.device_address(),
               a.dout.numel(), a.accumulate_a, a.accumulate_b);
}

void launch_cast(const Cast& a) {
  cast(element_of(a.src, "cast", "src"), a.src.device_address(), element_of(a.dst, "cast", "dst"),
       a.dst.device_address(), a.src.numel(), a.accumulate);
}

void launch_layernorm_forward(const LayernormForward& a) {
  const int64_t C = last_axis(a.inp);
  layernorm_forward(element_of(a.inp, "layernorm_forward", "inp"), a.out.device_address(), device<float>(a.mean),
                    device<float>(a.rstd), a.inp.device_address(), device<float>(a.weight), device<float>(a.bias),
                    a.inp.numel() / C, C, a.eps);
}
void launch_layernorm_backward(const LayernormBackward& a) {
  const int64_t C = last_axis(a.inp);
  layernorm_backward(element_of(a.inp, "layernorm_backward", "inp"), a.dinp.device_address(), device<float>(a.dweight),
                     device<float>(a.dbias), a.dout.device_address(), a.inp.device_address(), device<float>(a.weight),
                     device<float>(a.mean), device<float>(a.rstd), a.inp.numel() / C, C, a.accumulate_dinp);
}

void launch_embedding_forward(const EmbeddingForward& a) {
  // Ragged positions live in host memory (serving's batches); serving is not on CUDA yet.
  check(!a.positions.defined() && !a.wte_interleaved,
        "cuda embedding_forward: per-row positions and interleaved tables (decoding's) are not on CUDA yet");
  const int64_t B = a.tokens.shape()[0], T = a.tokens.shape()[1];
  embedding_forward(device<float>(a.out), device<int32_t>(a.tokens), device<float>(a.wte), device<float>(a.wpe),
                    nullptr, a.position0, B, T, last_axis(a.wte), a.wte.shape()[0], a.vocab_begin, a.add_positions);
}
void launch_embedding_backward(const EmbeddingBackward& a) {
  const int64_t B = a.tokens.shape()[0], T = a.tokens.shape()[1];
  embedding_backward(device<float>(a.dwte), device<float>(a.dwpe), device<float>(a.dout), device<int32_t>(a.tokens), B,
                     T, last_axis(a.dwte), a.dwte.shape()[0], a.vocab_begin, a.add_positions);
}

void launch_softmax_xent_forward(const SoftmaxXentForward& a) {
  const int64_t V = last_axis(a.logits);
  softmax_xent_forward(device<float>(a.losses), device<float>(a.stats), device<float>(a.logits),
                       device<int32_t>(a.targets), a.logits.numel() / V, V);
}
void launch_softmax_xent_backward(const SoftmaxXentBackward& a) {
  const int64_t V = last_axis(a.logits);
  softmax_xent_backward(device<float>(a.dlogits), device<float>(a.logits), device<float>(a.stats),
                        device<int32_t>(a.targets), device<float>(a.dlosses), a.logits.numel() / V, V, a.vocab_begin,
                        a.accumulate);
}

AttentionShape attention_shape(const Tensor& qkv, int64_t n_head, int64_t n_kv_head, float scale) {
  const int64_t kv_heads = n_kv_head == 0 ? n_head : n_kv_head;
  const int64_t head_size = last_axis(qkv) / (n_head + 2 * kv_heads);
  check(head_size <= 256, "cuda attention: head size {} (at most 256: a warp's registers hold a row)", head_size);
  check(n_head % kv_heads == 0, "cuda attention: {} query heads do not share {} kv heads evenly", n_head, kv_heads);
  return {qkv.shape()[0], qkv.shape()[1], n_head, kv_heads, head_size, scale};
}

void launch_attention_forward(const AttentionForward& a) {
  attention_forward(element_of(a.qkv, "attention_forward", "qkv"), a.out.device_address(), device<float>(a.logsumexp),
                    a.qkv.device_address(), attention_shape(a.qkv, a.n_head, a.n_kv_head, a.scale));
}
void launch_attention_backward(const AttentionBackward& a) {
  const AttentionShape shape = attention_shape(a.qkv, a.n_head, a.n_kv_head, a.scale);
  Scratch row_dots(sizeof(float) * static_cast<size_t>(shape.B * shape.n_head * shape.T));
  attention_backward(element_of(a.qkv, "attention_backward", "qkv"), a.dqkv.device_address(), a.dout.device_address(),
                     a.qkv.device_address(), device<float>(a.logsumexp), row_dots.as<float>(), shape,
                     a.accumulate_dqkv);
}

void launch_adamw_update(const AdamWUpdate& a) {
  check(!a.param_copy.defined() || a.param_copy.dtype() == DType::bf16,
        "cuda adamw_update: the parameters' 16-bit copy is {}; CUDA writes bf16 copies", dtype_name(a.param_copy.dtype()));
  const AdamWParams& p = a.params;
  adamw_update(device<float>(a.param), device<float>(a.grad), device<float>(a.m), device<float>(a.v),
               device(a.param_copy), a.param.numel(), p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step,
               p.grad_scale);
}

// The result is host memory: the sum is copied back before this returns.
void launch_sum_squares(const SumSquares& a) {
  Scratch sums(sizeof(double) * (kSumSquaresBlocks + 1));
  sum_squares(device<float>(a.x), a.x.numel(), sums.as<double>());
  check_cuda(cudaMemcpyAsync(a.result, sums.as<double>(), sizeof(double), cudaMemcpyDeviceToHost, stream()),
             "sum_squares result");
  check_cuda(cudaStreamSynchronize(stream()), "sum_squares");
}

}  // namespace

void register_cuda_kernels(KernelRegistry& registry) {
  constexpr DeviceKind cuda = DeviceKind::cuda;
  for (DType dtype : {DType::f32, DType::bf16}) {
    registry.add(cuda, dtype, &matmul_forward);
    registry.add(cuda, dtype, &matmul_backward);
    registry.add(cuda, dtype, &launch_layernorm_forward);
    registry.add(cuda, dtype, &launch_layernorm_backward);
    registry.add(cuda, dtype, &launch_add_forward);
    registry.add(cuda, dtype, &launch_add_backward);
    registry.add(cuda, dtype, &launch_attention_forward);
    registry.add(cuda, dtype, &launch_attention_backward);
    registry.add(cuda, dtype, &launch_cast);
  }
  registry.add(cuda, DType::f32, &launch_embedding_forward);
  registry.add(cuda, DType::f32, &launch_embedding_backward);
  registry.add(cuda, DType::f32, &launch_softmax_xent_forward);
  registry.add(cuda, DType::f32, &launch_softmax_xent_backward);
  registry.add(cuda, DType::f32, &launch_sum_squares);
  registry.add(cuda, DType::f32, &launch_adamw_update);
}

}  // namespace paraflow::cuda
