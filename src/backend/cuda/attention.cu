// Causal multi-head attention, a simple kernel of ours: one warp per query row (forward, and the
// query gradient) or per key row (the key and value gradients), each lane holding head_size/32 of
// the row's channels in registers, the scores summed across the warp. Online softmax forward,
// logsumexp kept; backward recomputes the probabilities from it (no (T,T) matrix anywhere) and
// writes every gradient row from one warp, so no atomics and the same sums on every run. It reads
// each key row once per query from L2: correct, not fast (FlashAttention's tiling is the next step).
#include <type_traits>

#include "backend/cuda/device_math.cuh"

namespace paraflow::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 8;  // head_size <= 256

struct Layout {
  int64_t B, T, NH, KVH, hs, row;  // row: qkv's row length, (NH + 2·KVH)·hs
  float scale;
  __device__ int64_t q(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * row + h * hs; }
  __device__ int64_t k(int64_t b, int64_t t, int64_t g) const { return (b * T + t) * row + (NH + g) * hs; }
  __device__ int64_t v(int64_t b, int64_t t, int64_t g) const { return (b * T + t) * row + (NH + KVH + g) * hs; }
  __device__ int64_t out(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * NH * hs + h * hs; }
  __device__ int64_t stat(int64_t b, int64_t h, int64_t t) const { return (b * NH + h) * T + t; }
};

template <typename T>
__device__ void load_row(float (&values)[kMaxPerLane], const T* p, int64_t offset, int64_t hs, int lane) {
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    values[k] = d < hs ? load(p, offset + d) : 0.0f;
  }
}
template <typename T>
__device__ float dot_row(const float (&values)[kMaxPerLane], const T* p, int64_t offset, int64_t hs, int lane) {
  float partial = 0.0f;
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < hs) partial += values[k] * load(p, offset + d);
  }
  return warp_sum(partial);
}
template <typename T>
__device__ void store_row(T* p, int64_t offset, const float (&values)[kMaxPerLane], int64_t hs, int lane,
                          bool accumulate) {
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < hs) store(p, offset + d, (accumulate ? load(p, offset + d) : 0.0f) + values[k]);
  }
}

__device__ int64_t warp_index() { return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; }

template <typename T>
__global__ void attention_forward_kernel(T* out, float* logsumexp, const T* qkv, Layout L) {
  const int64_t w = warp_index();
  if (w >= L.B * L.NH * L.T) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = w % L.T, h = w / L.T % L.NH, b = w / (L.T * L.NH), g = h / (L.NH / L.KVH);
  float q[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(q, qkv, L.q(b, t, h), L.hs, lane);
  float max_score = -INFINITY, sum = 0.0f;
  for (int64_t j = 0; j <= t; ++j) {
    const float score = L.scale * dot_row(q, qkv, L.k(b, j, g), L.hs, lane);
    const float new_max = fmaxf(max_score, score);
    const float correction = expf(max_score - new_max), p = expf(score - new_max);
    sum = sum * correction + p;
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int64_t d = lane + 32 * k;
      acc[k] = acc[k] * correction + (d < L.hs ? p * load(qkv, L.v(b, j, g) + d) : 0.0f);
    }
    max_score = new_max;
  }
  for (float& value : acc) value /= sum;
  store_row(out, L.out(b, t, h), acc, L.hs, lane, false);
  if (lane == 0) logsumexp[L.stat(b, h, t)] = max_score + logf(sum);
}

// Query row i: D_i = Σ_j P_ij dP_ij (kept for the key pass), then dq_i = scale Σ_j P_ij (dP_ij - D_i) k_j,
// where P_ij = exp(scale q_i·k_j - lse_i) and dP_ij = dO_i·v_j.
template <typename T>
__global__ void attention_backward_queries(T* dqkv, float* row_dots, const T* dout, const T* qkv,
                                           const float* logsumexp, Layout L, bool accumulate) {
  const int64_t w = warp_index();
  if (w >= L.B * L.NH * L.T) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = w % L.T, h = w / L.T % L.NH, b = w / (L.T * L.NH), g = h / (L.NH / L.KVH);
  float q[kMaxPerLane], dO[kMaxPerLane], dq[kMaxPerLane] = {};
  load_row(q, qkv, L.q(b, i, h), L.hs, lane);
  load_row(dO, dout, L.out(b, i, h), L.hs, lane);
  const float lse = logsumexp[L.stat(b, h, i)];
  float D = 0.0f;
  for (int64_t j = 0; j <= i; ++j) {
    const float p = expf(L.scale * dot_row(q, qkv, L.k(b, j, g), L.hs, lane) - lse);
    D += p * dot_row(dO, qkv, L.v(b, j, g), L.hs, lane);
  }
  for (int64_t j = 0; j <= i; ++j) {
    const float p = expf(L.scale * dot_row(q, qkv, L.k(b, j, g), L.hs, lane) - lse);
    const float ds = p * (dot_row(dO, qkv, L.v(b, j, g), L.hs, lane) - D);
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int64_t d = lane + 32 * k;
      if (d < L.hs) dq[k] += L.scale * ds * load(qkv, L.k(b, j, g) + d);
    }
  }
  store_row(dqkv, L.q(b, i, h), dq, L.hs, lane, accumulate);
  if (lane == 0) row_dots[L.stat(b, h, i)] = D;
}

// Key row j of kv head g: dk_j = scale Σ_h Σ_{i>=j} P_ij (dP_ij - D_i) q_i and dv_j = Σ_h Σ_{i>=j} P_ij dO_i,
// over the query heads h that read this kv head.
template <typename T>
__global__ void attention_backward_keys(T* dqkv, const float* row_dots, const T* dout, const T* qkv,
                                        const float* logsumexp, Layout L, bool accumulate) {
  const int64_t w = warp_index();
  if (w >= L.B * L.KVH * L.T) return;
  const int lane = threadIdx.x % 32;
  const int64_t j = w % L.T, g = w / L.T % L.KVH, b = w / (L.T * L.KVH), group = L.NH / L.KVH;
  float key[kMaxPerLane], value[kMaxPerLane], dk[kMaxPerLane] = {}, dv[kMaxPerLane] = {};
  load_row(key, qkv, L.k(b, j, g), L.hs, lane);
  load_row(value, qkv, L.v(b, j, g), L.hs, lane);
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i = j; i < L.T; ++i) {
      const float p = expf(L.scale * dot_row(key, qkv, L.q(b, i, h), L.hs, lane) - logsumexp[L.stat(b, h, i)]);
      const float ds = p * (dot_row(value, dout, L.out(b, i, h), L.hs, lane) - row_dots[L.stat(b, h, i)]);
      for (int k = 0; k < kMaxPerLane; ++k) {
        const int64_t d = lane + 32 * k;
        if (d >= L.hs) continue;
        dv[k] += p * load(dout, L.out(b, i, h) + d);
        dk[k] += L.scale * ds * load(qkv, L.q(b, i, h) + d);
      }
    }
  }
  store_row(dqkv, L.k(b, j, g), dk, L.hs, lane, accumulate);
  store_row(dqkv, L.v(b, j, g), dv, L.hs, lane, accumulate);
}

Layout layout_of(const AttentionShape& s) {
  return {s.B, s.T, s.n_head, s.n_kv_head, s.head_size, (s.n_head + 2 * s.n_kv_head) * s.head_size, s.scale};
}

unsigned warp_blocks(int64_t warps) { return blocks_for(warps, kWarpsPerBlock); }

}  // namespace

void attention_forward(Element type, void* out, float* logsumexp, const void* qkv, const AttentionShape& shape) {
  const Layout L = layout_of(shape);
  dispatch(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    attention_forward_kernel<<<warp_blocks(L.B * L.NH * L.T), 32 * kWarpsPerBlock, 0, stream()>>>(
        static_cast<T*>(out), logsumexp, static_cast<const T*>(qkv), L);
  });
  check_launch("attention_forward");
}

void attention_backward(Element type, void* dqkv, const void* dout, const void* qkv, const float* logsumexp,
                        float* scratch, const AttentionShape& shape, bool accumulate_dqkv) {
  const Layout L = layout_of(shape);
  dispatch(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    attention_backward_queries<<<warp_blocks(L.B * L.NH * L.T), 32 * kWarpsPerBlock, 0, stream()>>>(
        static_cast<T*>(dqkv), scratch, static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp, L,
        accumulate_dqkv);
    attention_backward_keys<<<warp_blocks(L.B * L.KVH * L.T), 32 * kWarpsPerBlock, 0, stream()>>>(
        static_cast<T*>(dqkv), scratch, static_cast<const T*>(dout), static_cast<const T*>(qkv), logsumexp, L,
        accumulate_dqkv);
  });
  check_launch("attention_backward");
}

}  // namespace paraflow::cuda
