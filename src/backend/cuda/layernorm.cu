// LayerNorm over the last axis: one block per row, the statistics in f32 as the CPU's (mean,
// then the mean of squared deviations). The weight and bias gradients take one thread per
// channel summing down the rows in order (no atomics: the same sums on every run).
#include <type_traits>

#include "backend/cuda/device_math.cuh"

namespace paraflow::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const float* weight,
                                         const float* bias, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* x = inp + row * C;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += load(x, c);
  const float m = block_sum(sum, shared) / static_cast<float>(C);
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum_sq += (load(x, c) - m) * (load(x, c) - m);
  const float s = rsqrtf(block_sum(sum_sq, shared) / static_cast<float>(C) + eps);
  T* y = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store(y, c, (load(x, c) - m) * s * weight[c] + bias[c]);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
__global__ void layernorm_backward_rows(T* dinp, const T* dout, const T* inp, const float* weight, const float* mean,
                                        const float* rstd, int64_t C, bool accumulate_dinp) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T *x = inp + row * C, *dy = dout + row * C;
  T* dx = dinp + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (load(x, c) - m) * s, dnorm = weight[c] * load(dy, c);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float mean_dnorm = block_sum(dnorm_sum, shared) / static_cast<float>(C);
  const float mean_dnorm_norm = block_sum(dnorm_norm_sum, shared) / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (load(x, c) - m) * s;
    const float contribution = s * (weight[c] * load(dy, c) - mean_dnorm - norm * mean_dnorm_norm);
    store(dx, c, accumulate_dinp ? load(dx, c) + contribution : contribution);
  }
}

template <typename T>
__global__ void layernorm_backward_parameters(float* dweight, float* dbias, const T* dout, const T* inp,
                                              const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t n = 0; n < N; ++n) {
    const float g = load(dout, n * C + c);
    db += g;
    dw += (load(inp, n * C + c) - mean[n]) * rstd[n] * g;
  }
  dweight[c] += dw;
  dbias[c] += db;
}

}  // namespace

void layernorm_forward(Element type, void* out, float* mean, float* rstd, const void* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
  dispatch(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    layernorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp), weight, bias, C, eps);
  });
  check_launch("layernorm_forward");
}

void layernorm_backward(Element type, void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dinp) {
  dispatch(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    layernorm_backward_rows<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), weight, mean, rstd, C,
        accumulate_dinp);
    layernorm_backward_parameters<<<blocks_for(C, kThreads), kThreads, 0, stream()>>>(
        dweight, dbias, static_cast<const T*>(dout), static_cast<const T*>(inp), mean, rstd, N, C);
  });
  check_launch("layernorm_backward");
}

}  // namespace paraflow::cuda
