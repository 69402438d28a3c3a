// The kernels Llama-family blocks add to GPT-2's: RMSNorm, rotary position embeddings and SwiGLU,
// each reading and writing f32, bf16 or f16 activations (mixed precision's) with f32 arithmetic in
// registers: memory-bound, so 16-bit storage halves their bytes, and each output is rounded once.
#include <omp.h>

#include <cmath>
#include <vector>

#include "backend/cpu/fast_math.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/storage.h"

namespace paraflow::cpu {

// inp, out, dinp and dout of storage type T (f32, bf16 or f16), the sums in f32.
template <typename T>
void rmsnorm_forward(const RmsnormForward& a) {
  const int64_t C = a.inp.shape()[a.inp.shape().rank() - 1], N = a.inp.numel() / C;
  const T* inp = pointer<T>(a.inp);
  const float* weight = pointer<float>(a.weight);
  T* out = pointer<T>(a.out);
  float* rstd = pointer<float>(a.rstd);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t c = 0; c < C; ++c) sum_sq += to_float(x[c]) * to_float(x[c]);
    const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + a.eps);
    // transformers' order: weight * (x * rstd)
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = from_float<T>(weight[c] * (to_float(x[c]) * s));
    rstd[n] = s;
  }
}

// dx = rstd·w·dy - rstd³·x·mean(w·dy·x); dweight += x·rstd·dy, summed per fixed block of rows
// (one per thread asked for) and then in block order, as layernorm's.
template <typename T>
void rmsnorm_backward(const RmsnormBackward& a) {
  const int64_t C = a.inp.shape()[a.inp.shape().rank() - 1], N = a.inp.numel() / C;
  const T *inp = pointer<T>(a.inp), *dout = pointer<T>(a.dout);
  const float *weight = pointer<float>(a.weight), *rstd = pointer<float>(a.rstd);
  T* dinp = pointer<T>(a.dinp);
  float* dweight = pointer<float>(a.dweight);
  const int blocks = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(blocks) * C, 0.0f);
#pragma omp parallel for schedule(static, 1)
  for (int block = 0; block < blocks; ++block) {
    float* pw = partial.data() + static_cast<int64_t>(block) * C;
    for (int64_t n = N * block / blocks; n < N * (block + 1) / blocks; ++n) {
      const T *x = inp + n * C, *dy = dout + n * C;
      const float s = rstd[n];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += weight[c] * to_float(dy[c]) * to_float(x[c]);
      const float correction = s * s * s * dot / static_cast<float>(C);
      T* dx = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        pw[c] += to_float(x[c]) * s * to_float(dy[c]);
        const float contribution = s * weight[c] * to_float(dy[c]) - correction * to_float(x[c]);
        dx[c] = from_float<T>(a.accumulate_dinp ? to_float(dx[c]) + contribution : contribution);
      }
    }
  }
  for (int block = 0; block < blocks; ++block) {
    for (int64_t c = 0; c < C; ++c) dweight[c] += partial[static_cast<size_t>(block) * C + c];
  }
}

namespace {

// Rotates each q and k head of the rows of `from` into `to` (of storage type S) by their
// positions' angles (sign -1: the inverse rotation, backward's), copies v; `to` is assigned or
// (accumulate) added to. The cosines and sines are computed once per position: per row of a
// ragged batch (`positions`), else once for the T positions every sequence shares.
template <typename S>
void rotate_rows(S* to, const S* from, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hs,
                 const RopeFrequencies& frequencies, int64_t position0, const int32_t* positions, float sign,
                 bool accumulate) {
  const std::vector<float> inverse = rope_inverse_frequencies(frequencies, hs);
  const int64_t half = hs / 2, rotated = (NH + KVH) * hs, width = (NH + 2 * KVH) * hs;
  const int64_t angles = positions != nullptr ? B * T : T;
  std::vector<float> cos(static_cast<size_t>(angles * half)), sin(cos.size());
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < angles; ++p) {
    const int64_t position = positions != nullptr ? positions[p] : position0 + p;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(position) * inverse[static_cast<size_t>(i)];  // float32, as torch
      cos[static_cast<size_t>(p * half + i)] = std::cos(angle);
      sin[static_cast<size_t>(p * half + i)] = sign * std::sin(angle);
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; ++row) {
    const int64_t p = positions != nullptr ? row : row % T;
    const float *row_cos = cos.data() + p * half, *row_sin = sin.data() + p * half;
    const S* x = from + row * width;
    S* y = to + row * width;
    for (int64_t head = 0; head < rotated; head += hs) {
      for (int64_t i = 0; i < half; ++i) {
        const float first = to_float(x[head + i]), second = to_float(x[head + half + i]);
        const float c = row_cos[i], s = row_sin[i];
        const float out_first = first * c - second * s, out_second = second * c + first * s;
        y[head + i] = from_float<S>(accumulate ? to_float(y[head + i]) + out_first : out_first);
        y[head + half + i] = from_float<S>(accumulate ? to_float(y[head + half + i]) + out_second : out_second);
      }
    }
    for (int64_t i = rotated; i < width; ++i) y[i] = accumulate ? from_float<S>(to_float(y[i]) + to_float(x[i])) : x[i];
  }
}

}  // namespace

template <typename T>
void rope_forward(const RopeForward& a) {
  const Shape& shape = a.qkv.shape();
  const int64_t hs = shape[2] / (a.n_head + 2 * a.n_kv_head);
  rotate_rows(pointer<T>(a.out), pointer<T>(a.qkv), shape[0], shape[1], a.n_head, a.n_kv_head, hs, a.frequencies,
              a.position0, a.positions.defined() ? a.positions.data<int32_t>() : nullptr, 1.0f, false);
}

template <typename T>
void rope_backward(const RopeBackward& a) {
  const Shape& shape = a.dout.shape();
  const int64_t hs = shape[2] / (a.n_head + 2 * a.n_kv_head);
  rotate_rows(pointer<T>(a.dqkv), pointer<T>(a.dout), shape[0], shape[1], a.n_head, a.n_kv_head, hs, a.frequencies, 0,
              nullptr, -1.0f, a.accumulate_dqkv);
}

template <typename T>
void swiglu_forward(const SwigluForward& a) {
  const T *gate = pointer<T>(a.gate), *up = pointer<T>(a.up);
  T* out = pointer<T>(a.out);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < a.gate.numel(); ++i) {
    const float g = to_float(gate[i]);
    out[i] = from_float<T>(g / (1.0f + fast_exp(-g)) * to_float(up[i]));
  }
}

// d silu(g)/dg = σ(g)·(1 + g·(1 - σ(g))). (fast_exp: glibc's expf keeps these loops scalar.)
template <typename T>
void swiglu_backward(const SwigluBackward& a) {
  const T *gate = pointer<T>(a.gate), *up = pointer<T>(a.up), *dout = pointer<T>(a.dout);
  T *dgate = pointer<T>(a.dgate), *dup = pointer<T>(a.dup);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < a.gate.numel(); ++i) {
    const float g = to_float(gate[i]), dy = to_float(dout[i]);
    const float sigmoid = 1.0f / (1.0f + fast_exp(-g));
    if (dgate != nullptr) {
      const float d = dy * to_float(up[i]) * sigmoid * (1.0f + g * (1.0f - sigmoid));
      dgate[i] = from_float<T>(a.accumulate_gate ? to_float(dgate[i]) + d : d);
    }
    if (dup != nullptr) {
      const float d = dy * g * sigmoid;
      dup[i] = from_float<T>(a.accumulate_up ? to_float(dup[i]) + d : d);
    }
  }
}

#define PARAFLOW_LLAMA_KERNELS(T)                        \
  template void rmsnorm_forward<T>(const RmsnormForward&);   \
  template void rmsnorm_backward<T>(const RmsnormBackward&); \
  template void rope_forward<T>(const RopeForward&);         \
  template void rope_backward<T>(const RopeBackward&);       \
  template void swiglu_forward<T>(const SwigluForward&);     \
  template void swiglu_backward<T>(const SwigluBackward&);
PARAFLOW_LLAMA_KERNELS(float)
PARAFLOW_LLAMA_KERNELS(BFloat16)
PARAFLOW_LLAMA_KERNELS(Float16)
#undef PARAFLOW_LLAMA_KERNELS

}  // namespace paraflow::cpu
