#include <omp.h>

#include <cmath>
#include <vector>

#include "backend/cpu/fast_math.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void matmul_forward(const MatmulForward& args) {
  const int64_t OC = args.out.shape()[args.out.shape().rank() - 1];
  const int64_t C = args.inp.shape()[args.inp.shape().rank() - 1], N = args.inp.numel() / C;
  const bool gelu = args.gelu;
  const WeightLayout layout = args.layout;
  const float *inp = pointer<float>(args.inp), *weight = pointer<float>(args.weight);
  const float* bias = pointer<float>(args.bias);
  float *out = pointer<float>(args.out), *pre = pointer<float>(args.pre);
  // target (N,OC) = inp (N,C) · W, with W [C,OC] (in_out) or [OC,C] (out_in)
  float* target = gelu ? pre : out;
  bool transposed = layout == WeightLayout::out_in;
  // The bias goes into the GEMM's write-back when the engine can: one pass over the output less.
  if (bias != nullptr && sgemm_bias(transposed, N, OC, C, inp, C, weight, transposed ? C : OC, bias, target, OC)) {
    bias = nullptr;
  } else {
    sgemm(false, transposed, N, OC, C, 1.0f, inp, C, weight, transposed ? C : OC, 0.0f, target, OC);
  }
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
        out_row[o] = 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
      }
    }
  }
}

namespace {

// dbias[o] += sum over rows of dout[n, o], optionally after turning dout into the gradient of the
// GELU's input in place (the same pass over dout serves both). Each thread sums a fixed block of
// rows into its own partials (contiguous reads), added in thread order: the result is the same
// on every run with the same thread count.
void bias_gradient(float* dbias, float* dout, const float* pre, int64_t N, int64_t OC) {
  const int threads = omp_get_max_threads();
  std::vector<float> partial(dbias != nullptr ? static_cast<size_t>(threads) * OC : 0, 0.0f);
#pragma omp parallel num_threads(threads)
  {
    const int id = omp_get_thread_num();
    float* sums = dbias != nullptr ? partial.data() + static_cast<int64_t>(id) * OC : nullptr;
    const int64_t begin = N * id / threads, end = N * (id + 1) / threads;
    for (int64_t n = begin; n < end; ++n) {
      float* d = dout + n * OC;
      if (pre != nullptr) {
        const float* p = pre + n * OC;
#pragma omp simd
        for (int64_t o = 0; o < OC; ++o) {
          float x = p[o];
          float t = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
          d[o] *= 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
        }
      }
      if (sums != nullptr) {
#pragma omp simd
        for (int64_t o = 0; o < OC; ++o) sums[o] += d[o];
      }
    }
  }
  if (dbias == nullptr) return;
  for (int id = 0; id < threads; ++id) {
    const float* sums = partial.data() + static_cast<int64_t>(id) * OC;
#pragma omp simd
    for (int64_t o = 0; o < OC; ++o) dbias[o] += sums[o];
  }
}

}  // namespace

void matmul_backward(const MatmulBackward& args) {
  const int64_t OC = args.dout.shape()[args.dout.shape().rank() - 1];
  const int64_t C = args.inp.shape()[args.inp.shape().rank() - 1], N = args.inp.numel() / C;
  const bool gelu = args.gelu, accumulate_dinp = args.accumulate_dinp;
  const WeightLayout layout = args.layout;
  const float *inp = pointer<float>(args.inp), *weight = pointer<float>(args.weight), *pre = pointer<float>(args.pre);
  float *dinp = pointer<float>(args.dinp), *dweight = pointer<float>(args.dweight), *dbias = pointer<float>(args.dbias);
  float* dout = pointer<float>(args.dout);
  // dout (N,OC) becomes the gradient of the pre-activation in place (with GELU), and the bias
  // gradient is summed in the same pass.
  if (gelu || dbias != nullptr) bias_gradient(dbias, dout, gelu ? pre : nullptr, N, OC);
  bool transposed = layout == WeightLayout::out_in;
  if (dinp != nullptr) {
    // dinp (N,C) (+)= dout (N,OC) · W^T
    sgemm(false, !transposed, N, C, OC, 1.0f, dout, OC, weight, transposed ? C : OC, accumulate_dinp ? 1.0f : 0.0f,
          dinp, C);
  }
  if (transposed) {
    // dW [OC,C] += dout^T · inp
    sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  } else {
    // dW [C,OC] += inp^T · dout
    sgemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  }
}

}  // namespace paraflow::cpu
