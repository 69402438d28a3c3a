#include <cmath>
#include <vector>

#include "backend/cpu/fast_math.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

// One (batch, head) pair per iteration; its GEMMs run single-threaded inside the parallel loop.
// q, k and v are read in place from qkv with a row stride of 3C.

void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * 3 * C + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = probs + bh * T * T;  // (T,T)
    // scores = scale * q · k^T
    sgemm(false, true, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, p, T);
    for (int64_t t = 0; t < T; ++t) {
      float* row = p + t * T;
      float max_value = -INFINITY;
#pragma omp simd reduction(max : max_value)
      for (int64_t j = 0; j <= t; ++j) max_value = row[j] > max_value ? row[j] : max_value;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j <= t; ++j) {
        row[j] = fast_exp(row[j] - max_value);
        sum += row[j];
      }
      float inverse = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j <= t; ++j) row[j] *= inverse;
      for (int64_t j = t + 1; j < T; ++j) row[j] = 0.0f;
    }
    // out (T,hs) with row stride C = probs · v
    sgemm(false, false, T, hs, T, 1.0f, p, T, v, 3 * C, 0.0f, out + b * T * C + h * hs, C);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int64_t B, int64_t T,
                        int64_t C, int64_t NH, bool accumulate_dqkv) {
  const int64_t hs = C / NH;
  const float beta = accumulate_dqkv ? 1.0f : 0.0f;  // the heads' q, k, v slices tile dqkv
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    std::vector<float> dscores(static_cast<size_t>(T * T));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      int64_t b = bh / NH, h = bh % NH;
      const float* q = qkv + b * T * 3 * C + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * 3 * C + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* p = probs + bh * T * T;
      const float* dy = dout + b * T * C + h * hs;
      float* ds = dscores.data();
      // dprobs = dout · v^T ; dv += probs^T · dout
      sgemm(false, true, T, T, hs, 1.0f, dy, C, v, 3 * C, 0.0f, ds, T);
      sgemm(true, false, T, hs, T, 1.0f, p, T, dy, C, beta, dv, 3 * C);
      // softmax backward, in place: dscores = probs * (dprobs - sum(probs * dprobs))
      for (int64_t t = 0; t < T; ++t) {
        const float* prow = p + t * T;
        float* drow = ds + t * T;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j <= t; ++j) dot += prow[j] * drow[j];
#pragma omp simd
        for (int64_t j = 0; j <= t; ++j) drow[j] = prow[j] * (drow[j] - dot);
        for (int64_t j = t + 1; j < T; ++j) drow[j] = 0.0f;
      }
      // dq += scale * dscores · k ; dk += scale * dscores^T · q
      sgemm(false, false, T, hs, T, scale, ds, T, k, 3 * C, beta, dq, 3 * C);
      sgemm(true, false, T, hs, T, scale, ds, T, q, 3 * C, beta, dk, 3 * C);
    }
  }
}

}  // namespace paraflow::cpu

namespace paraflow::cpu {

void attention_cached_forward(float* out, const float* qkv, float* k_cache, float* v_cache, int64_t B, int64_t Tn,
                              int64_t C, int64_t NH, int64_t past, int64_t max_T) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(past + Tn));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      int64_t b = bh / NH, h = bh % NH;
      float* keys = k_cache + bh * max_T * hs;    // (max_T, hs)
      float* values = v_cache + bh * max_T * hs;  // (max_T, hs)
      for (int64_t t = 0; t < Tn; ++t) {
        const float* row = qkv + (b * Tn + t) * 3 * C + h * hs;
        std::copy(row + C, row + C + hs, keys + (past + t) * hs);
        std::copy(row + 2 * C, row + 2 * C + hs, values + (past + t) * hs);
      }
      for (int64_t t = 0; t < Tn; ++t) {
        const float* q = qkv + (b * Tn + t) * 3 * C + h * hs;
        const int64_t visible = past + t + 1;
        float max_value = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * keys[j * hs + i];
          scores[j] = dot * scale;
          max_value = scores[j] > max_value ? scores[j] : max_value;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) sum += (scores[j] = std::exp(scores[j] - max_value));
        float* y = out + (b * Tn + t) * C + h * hs;
        std::fill(y, y + hs, 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          float p = scores[j] / sum;
#pragma omp simd
          for (int64_t i = 0; i < hs; ++i) y[i] += p * values[j * hs + i];
        }
      }
    }
  }
}

}  // namespace paraflow::cpu
