// AdamW (torch.optim.AdamW's order: decay, then the bias-corrected step) and the sum of squares
// gradient clipping reads, both f32.
#include <cmath>

#include "backend/cuda/device_math.cuh"

namespace paraflow::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, __nv_bfloat16* copy, int64_t n,
                             float beta1, float beta2, float eps, float decay, float step_size,
                             float correction2_sqrt, float grad_scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i] * grad_scale;
  const float mi = beta1 * m[i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float updated = param[i] * decay - step_size * mi / (sqrtf(vi) / correction2_sqrt + eps);
  param[i] = updated;
  if (copy != nullptr) copy[i] = __float2bfloat16_rn(updated);
}

// Fixed blocks of 256 threads, each block's sum in double written to `partial`; one thread then
// adds the blocks' sums in order: the same result on every run.
__global__ void sum_squares_blocks(const float* x, int64_t n, double* partial) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    sum += static_cast<double>(x[i]) * x[i];
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}
__global__ void sum_in_order(const double* partial, int blocks, double* result) {
  double total = 0.0;
  for (int b = 0; b < blocks; ++b) total += partial[b];
  *result = total;
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, void* param_copy, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  const float correction1 = 1.0f - static_cast<float>(std::pow(beta1, static_cast<double>(step)));
  const float correction2_sqrt = std::sqrt(1.0f - static_cast<float>(std::pow(beta2, static_cast<double>(step))));
  adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
      param, grad, m, v, static_cast<__nv_bfloat16*>(param_copy), n, beta1, beta2, eps, 1.0f - lr * weight_decay,
      lr / correction1, correction2_sqrt, grad_scale);
  check_launch("adamw_update");
}

// result must hold kSumSquaresBlocks + 1 doubles: the blocks' sums, then the total.
void sum_squares(const float* x, int64_t n, double* result) {
  sum_squares_blocks<<<kSumSquaresBlocks, kThreads, 0, stream()>>>(x, n, result + 1);
  sum_in_order<<<1, 1, 0, stream()>>>(result + 1, kSumSquaresBlocks, result);
  check_launch("sum_squares");
}

}  // namespace paraflow::cuda
