// Softmax cross-entropy fused over the vocabulary (f32): one block per row; the forward pass keeps
// (row max, log-sum-exp) so that the backward pass recomputes the probabilities.
#include "backend/cuda/device_math.cuh"

namespace paraflow::cuda {

namespace {

constexpr int kThreads = 512;

__device__ float block_max(float value, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(value);
}

__global__ void softmax_xent_forward_kernel(float* losses, float* stats, const float* logits, const int32_t* targets,
                                            int64_t V) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  float max_value = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) max_value = fmaxf(max_value, x[i]);
  max_value = block_max(max_value, shared);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - max_value);
  const float log_sum = logf(block_sum(sum, shared));
  if (threadIdx.x != 0) return;
  stats[2 * n] = max_value;
  stats[2 * n + 1] = max_value + log_sum;
  const int32_t target = targets[n];
  // -log p[target] from the logits directly keeps precision when p[target] is tiny.
  losses[n] = target < 0 ? 0.0f : log_sum - (x[target] - max_value);
}

__global__ void softmax_xent_backward_kernel(float* dlogits, const float* logits, const float* stats,
                                             const int32_t* targets, const float* dlosses, int64_t V,
                                             int64_t vocab_begin, bool accumulate) {
  const int64_t n = blockIdx.x;
  const int32_t target = targets[n];
  const float dloss = target < 0 ? 0.0f : dlosses[n];
  const float log_normalizer = stats[2 * n + 1];
  const int64_t column = static_cast<int64_t>(target) - vocab_begin;
  const float* x = logits + n * V;
  float* d = dlogits + n * V;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    float g = expf(x[i] - log_normalizer) * dloss;
    if (target >= 0 && i == column) g -= dloss;
    d[i] = accumulate ? d[i] + g : g;
  }
}

}  // namespace

void softmax_xent_forward(float* losses, float* stats, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
  softmax_xent_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(losses, stats, logits, targets, V);
  check_launch("softmax_xent_forward");
}

void softmax_xent_backward(float* dlogits, const float* logits, const float* stats, const int32_t* targets,
                           const float* dlosses, int64_t N, int64_t V, int64_t vocab_begin, bool accumulate) {
  softmax_xent_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
      dlogits, logits, stats, targets, dlosses, V, vocab_begin, accumulate);
  check_launch("softmax_xent_backward");
}

}  // namespace paraflow::cuda
