#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    float m = sum / static_cast<float>(C);
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t c = 0; c < C; ++c) sum_sq += (x[c] - m) * (x[c] - m);
    float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + eps);
    float* y = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool accumulate_dinp) {
  // dweight/dbias: per-thread partial sums over a fixed split of rows, added in thread order.
  int threads = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * C, 0.0f);
#pragma omp parallel num_threads(threads)
  {
    int id = omp_get_thread_num();
    float* pw = partial.data() + static_cast<int64_t>(id) * 2 * C;
    float* pb = pw + C;
    int64_t begin = N * id / threads, end = N * (id + 1) / threads;
    for (int64_t n = begin; n < end; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      float m = mean[n], s = rstd[n];
      float mean_dnorm = 0.0f, mean_dnorm_norm = 0.0f;
#pragma omp simd reduction(+ : mean_dnorm, mean_dnorm_norm)
      for (int64_t c = 0; c < C; ++c) {
        float norm = (x[c] - m) * s;
        float dnorm = weight[c] * dy[c];
        mean_dnorm += dnorm;
        mean_dnorm_norm += dnorm * norm;
      }
      mean_dnorm /= static_cast<float>(C);
      mean_dnorm_norm /= static_cast<float>(C);
      if (!accumulate_dinp) std::fill(dx, dx + C, 0.0f);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float norm = (x[c] - m) * s;
        float dnorm = weight[c] * dy[c];
        pb[c] += dy[c];
        pw[c] += norm * dy[c];
        dx[c] += s * (dnorm - mean_dnorm - norm * mean_dnorm_norm);
      }
    }
  }
  for (int id = 0; id < threads; ++id) {
    const float* pw = partial.data() + static_cast<int64_t>(id) * 2 * C;
    const float* pb = pw + C;
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] += pw[c];
      dbias[c] += pb[c];
    }
  }
}

}  // namespace paraflow::cpu
