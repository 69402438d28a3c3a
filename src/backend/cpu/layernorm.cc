#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/storage.h"

namespace paraflow::cpu {

namespace {

template <typename T>
void layernorm_forward_as(T* out, float* mean, float* rstd, const T* inp, const float* weight, const float* bias,
                          int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += to_float(x[c]);
    float m = sum / static_cast<float>(C);
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t c = 0; c < C; ++c) sum_sq += (to_float(x[c]) - m) * (to_float(x[c]) - m);
    float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + eps);
    T* y = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = from_float<T>((to_float(x[c]) - m) * s * weight[c] + bias[c]);
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
void layernorm_backward_as(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const float* weight,
                           const float* mean, const float* rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  // dweight/dbias: partial sums over one fixed block of rows per thread asked for, added in block
  // order (every block is done even when OpenMP grants a smaller team).
  const int blocks = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(blocks) * 2 * C, 0.0f);
#pragma omp parallel for schedule(static, 1)
  for (int block = 0; block < blocks; ++block) {
    float* pw = partial.data() + static_cast<int64_t>(block) * 2 * C;
    float* pb = pw + C;
    int64_t begin = N * block / blocks, end = N * (block + 1) / blocks;
    for (int64_t n = begin; n < end; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      T* dx = dinp + n * C;
      float m = mean[n], s = rstd[n];
      float mean_dnorm = 0.0f, mean_dnorm_norm = 0.0f;
#pragma omp simd reduction(+ : mean_dnorm, mean_dnorm_norm)
      for (int64_t c = 0; c < C; ++c) {
        float norm = (to_float(x[c]) - m) * s;
        float dnorm = weight[c] * to_float(dy[c]);
        mean_dnorm += dnorm;
        mean_dnorm_norm += dnorm * norm;
      }
      mean_dnorm /= static_cast<float>(C);
      mean_dnorm_norm /= static_cast<float>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float norm = (to_float(x[c]) - m) * s;
        float g = to_float(dy[c]);
        pb[c] += g;
        pw[c] += norm * g;
        float contribution = s * (weight[c] * g - mean_dnorm - norm * mean_dnorm_norm);
        dx[c] = from_float<T>(accumulate_dinp ? to_float(dx[c]) + contribution : contribution);
      }
    }
  }
  for (int block = 0; block < blocks; ++block) {
    const float* pw = partial.data() + static_cast<int64_t>(block) * 2 * C;
    const float* pb = pw + C;
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] += pw[c];
      dbias[c] += pb[c];
    }
  }
}

}  // namespace

template <typename T>
void layernorm_forward(const LayernormForward& a) {
  const int64_t C = a.inp.shape()[a.inp.shape().rank() - 1];
  layernorm_forward_as(pointer<T>(a.out), pointer<float>(a.mean), pointer<float>(a.rstd), pointer<T>(a.inp),
                       pointer<float>(a.weight), pointer<float>(a.bias), a.inp.numel() / C, C, a.eps);
}

template <typename T>
void layernorm_backward(const LayernormBackward& a) {
  const int64_t C = a.inp.shape()[a.inp.shape().rank() - 1];
  layernorm_backward_as(pointer<T>(a.dinp), pointer<float>(a.dweight), pointer<float>(a.dbias), pointer<T>(a.dout),
                        pointer<T>(a.inp), pointer<float>(a.weight), pointer<float>(a.mean), pointer<float>(a.rstd),
                        a.inp.numel() / C, C, a.accumulate_dinp);
}

template void layernorm_forward<float>(const LayernormForward&);
template void layernorm_forward<BFloat16>(const LayernormForward&);
template void layernorm_forward<Float16>(const LayernormForward&);
template void layernorm_backward<float>(const LayernormBackward&);
template void layernorm_backward<BFloat16>(const LayernormBackward&);
template void layernorm_backward<Float16>(const LayernormBackward&);

}  // namespace paraflow::cpu
