#include <cmath>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// tanh through exp, so the loop vectorises; saturates correctly for large |u|.
inline float tanh_via_exp(float u) { return 1.0f - 2.0f / (std::exp(2.0f * u) + 1.0f); }

}  // namespace

void matmul_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t C, int64_t OC, WeightLayout layout, bool gelu) {
  // target (N,OC) = inp (N,C) · W, with W [C,OC] (in_out) or [OC,C] (out_in)
  float* target = gelu ? pre : out;
  bool transposed = layout == WeightLayout::out_in;
  sgemm(false, transposed, N, OC, C, 1.0f, inp, C, weight, transposed ? C : OC, 0.0f, target, OC);
  if (bias == nullptr && !gelu) return;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = target + n * OC;
    if (bias != nullptr) {
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) row[o] += bias[o];
    }
    if (gelu) {
      float* out_row = out + n * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) {
        float x = row[o];
        out_row[o] = 0.5f * x * (1.0f + tanh_via_exp(kGeluScale * (x + kGeluCubic * x * x * x)));
      }
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, float* dout, const float* inp, const float* weight,
                     const float* pre, int64_t N, int64_t C, int64_t OC, WeightLayout layout, bool gelu) {
  if (gelu) {
    // dout (N,OC) becomes the gradient of the pre-activation, in place.
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* d = dout + n * OC;
      const float* p = pre + n * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) {
        float x = p[o];
        float t = tanh_via_exp(kGeluScale * (x + kGeluCubic * x * x * x));
        float local = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
        d[o] *= local;
      }
    }
  }
  bool transposed = layout == WeightLayout::out_in;
  if (dinp != nullptr) {
    // dinp (N,C) += dout (N,OC) · W^T
    sgemm(false, !transposed, N, C, OC, 1.0f, dout, OC, weight, transposed ? C : OC, 1.0f, dinp, C);
  }
  if (transposed) {
    // dW [OC,C] += dout^T · inp
    sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  } else {
    // dW [C,OC] += inp^T · dout
    sgemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) {
    // Column sums; each thread owns a band of columns and adds rows in order.
    constexpr int64_t kBand = 64;
#pragma omp parallel for schedule(static)
    for (int64_t o0 = 0; o0 < OC; o0 += kBand) {
      int64_t o1 = o0 + kBand < OC ? o0 + kBand : OC;
      float sums[kBand] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* d = dout + n * OC;
#pragma omp simd
        for (int64_t o = o0; o < o1; ++o) sums[o - o0] += d[o];
      }
      for (int64_t o = o0; o < o1; ++o) dbias[o] += sums[o - o0];
    }
  }
}

}  // namespace paraflow::cpu
