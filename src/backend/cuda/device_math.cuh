// What the .cu kernels share: element loads and stores in f32 arithmetic, warp and block sums,
// and the dispatch from Element to the storage type.
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels.h"

namespace paraflow::cuda {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
template <typename T>
__device__ __forceinline__ void store(T* p, int64_t i, float value);
template <>
__device__ __forceinline__ void store<float>(float* p, int64_t i, float value) { p[i] = value; }
// Round to nearest even, as the CPU's f32_to_bf16.
template <>
__device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float value) {
  p[i] = __float2bfloat16_rn(value);
}

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// The sum over a block of up to 1024 threads, returned to every thread. `shared` holds 32 floats.
__device__ __forceinline__ float block_sum(float value, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  value = warp_sum(value);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(value);
}

// Calls f with a null pointer of the storage type `type` names (for template deduction).
template <typename F>
void dispatch(Element type, F&& f) {
  if (type == Element::bf16) f(static_cast<__nv_bfloat16*>(nullptr));
  else f(static_cast<float*>(nullptr));
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace paraflow::cuda
