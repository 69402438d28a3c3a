#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/fast_math.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

// One (batch, head) pair per iteration; its GEMMs run single-threaded inside the parallel loop.
// q, k and v are read in place from qkv with a row stride of 3C. Causal blocking: rows are taken
// in blocks of kBlock, and a block only multiplies against the keys it can see (columns up to its
// last row), which skips ~3/8 of the T x T work at T = 4 blocks.

namespace {

constexpr int64_t kBlock = 64;

}  // namespace

void attention_forward(const AttentionForward& args) {
  const int64_t B = args.qkv.shape()[0], T = args.qkv.shape()[1], C = args.qkv.shape()[2] / 3, NH = args.n_head;
  const float scale = args.scale;
  const float* qkv = pointer<float>(args.qkv);
  float *out = pointer<float>(args.out), *probs = pointer<float>(args.probs);
  const int64_t hs = C / NH;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * 3 * C + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = probs + bh * T * T;  // (T,T)
    for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
      const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0, visible = r1;
      // scores[r0:r1, 0:visible] = scale * q · k^T
      sgemm(false, true, rows, visible, hs, scale, q + r0 * 3 * C, 3 * C, k, 3 * C, 0.0f, p + r0 * T, T);
      for (int64_t t = r0; t < r1; ++t) {
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
        std::fill(row + t + 1, row + T, 0.0f);
      }
      // out[r0:r1] (row stride C) = probs[r0:r1, 0:visible] · v[0:visible]
      sgemm(false, false, rows, hs, visible, 1.0f, p + r0 * T, T, v, 3 * C, 0.0f, out + (b * T + r0) * C + h * hs, C);
    }
  }
}

void attention_backward(const AttentionBackward& args) {
  const int64_t B = args.qkv.shape()[0], T = args.qkv.shape()[1], C = args.qkv.shape()[2] / 3, NH = args.n_head;
  const float scale = args.scale;
  const float *qkv = pointer<float>(args.qkv), *probs = pointer<float>(args.probs), *dout = pointer<float>(args.dout);
  float* dqkv = pointer<float>(args.dqkv);
  const bool accumulate_dqkv = args.accumulate_dqkv;
  const int64_t hs = C / NH;
  const float beta = accumulate_dqkv ? 1.0f : 0.0f;  // the heads' q, k, v slices tile dqkv
#pragma omp parallel
  {
    std::vector<float> dscores(static_cast<size_t>(kBlock * T));
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
      float* ds = dscores.data();  // (kBlock, T): this row block's score gradients
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0, visible = r1;
        const float* p_block = p + r0 * T;
        const float* dy_block = dy + r0 * C;
        // dprobs = dout · v^T over the visible keys
        sgemm(false, true, rows, visible, hs, 1.0f, dy_block, C, v, 3 * C, 0.0f, ds, T);
        // dv[0:visible] += probs^T · dout: keys [0, r0) were written by earlier blocks; keys
        // [r0, r1) are written first here, so they take the caller's accumulate/assign choice.
        if (r0 > 0) sgemm(true, false, r0, hs, rows, 1.0f, p_block, T, dy_block, C, 1.0f, dv, 3 * C);
        sgemm(true, false, rows, hs, rows, 1.0f, p_block + r0, T, dy_block, C, beta, dv + r0 * 3 * C, 3 * C);
        // softmax backward, in place: dscores = probs * (dprobs - sum(probs * dprobs))
        for (int64_t t = r0; t < r1; ++t) {
          const float* prow = p + t * T;
          float* drow = ds + (t - r0) * T;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j <= t; ++j) dot += prow[j] * drow[j];
#pragma omp simd
          for (int64_t j = 0; j <= t; ++j) drow[j] = prow[j] * (drow[j] - dot);
          std::fill(drow + t + 1, drow + visible, 0.0f);
        }
        // dq[r0:r1] = scale * dscores · k (its only writer) ; dk[0:visible] += scale * dscores^T · q
        sgemm(false, false, rows, hs, visible, scale, ds, T, k, 3 * C, beta, dq + r0 * 3 * C, 3 * C);
        if (r0 > 0) sgemm(true, false, r0, hs, rows, scale, ds, T, q + r0 * 3 * C, 3 * C, 1.0f, dk, 3 * C);
        sgemm(true, false, rows, hs, rows, scale, ds + r0, T, q + r0 * 3 * C, 3 * C, beta, dk + r0 * 3 * C, 3 * C);
      }
    }
  }
}

}  // namespace paraflow::cpu

namespace paraflow::cpu {

void attention_cached_forward(const AttentionCachedForward& args) {
  const int64_t B = args.qkv.shape()[0], Tn = args.qkv.shape()[1], C = args.qkv.shape()[2] / 3, NH = args.n_head;
  const int64_t past = args.past, max_T = args.k_cache.shape()[2];
  const float scale = args.scale;
  const float* qkv = pointer<float>(args.qkv);
  float *out = pointer<float>(args.out), *k_cache = pointer<float>(args.k_cache), *v_cache = pointer<float>(args.v_cache);
  const int64_t hs = C / NH;
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
