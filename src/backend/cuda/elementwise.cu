// Residual add, the matmul's bias and GELU (with its kept derivative) and output gradient, and casts: one pass
// over memory each, every element in f32 arithmetic.
#include <type_traits>

#include "backend/cuda/device_math.cuh"

namespace paraflow::cuda {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi), as the CPU's
constexpr float kGeluCubic = 0.044715f;

template <typename T>
__global__ void add_forward_kernel(T* out, const T* a, const T* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) store(out, i, load(a, i) + load(b, i));
}

// Each side gets dout (twice dout when both sides are one buffer, x + x).
template <typename T>
__global__ void add_backward_kernel(T* da, T* db, const T* dout, int64_t n, bool accumulate_a, bool accumulate_b) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = load(dout, i);
  if (da != nullptr && da == db) {
    store(da, i, (accumulate_a ? load(da, i) : 0.0f) + 2.0f * g);
    return;
  }
  if (da != nullptr) store(da, i, (accumulate_a ? load(da, i) : 0.0f) + g);
  if (db != nullptr) store(db, i, (accumulate_b ? load(db, i) : 0.0f) + g);
}

// sums may alias out only where out is f32 (each element is read before it is written).
template <typename T>
__global__ void finish_product_kernel(const float* sums, const float* bias, bool gelu, T* out, T* slope, int64_t N,
                                      int64_t OC) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N * OC) return;
  const float x = sums[i] + (bias != nullptr ? bias[i % OC] : 0.0f);
  if (!gelu) {
    store(out, i, x);
    return;
  }
  const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  if (slope != nullptr) {
    store(slope, i, 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x));
  }
  store(out, i, 0.5f * x * (1.0f + t));
}

// grad = dout * slope, element by element; the bias gradient, the same products in f32, is summed
// down each column by one thread per column (in row order: the same sums on every run).
template <typename D, typename G>
__global__ void output_gradient_kernel(const D* dout, const D* slope, G* grad, int64_t N, int64_t OC) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N * OC) return;
  store(grad, i, slope != nullptr ? load(dout, i) * load(slope, i) : load(dout, i));
}
template <typename D>
__global__ void column_sums_kernel(float* dbias, const D* dout, const D* slope, int64_t N, int64_t OC) {
  const int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (o >= OC) return;
  float sum = 0.0f;
  for (int64_t n = 0; n < N; ++n) sum += slope != nullptr ? load(dout, n * OC + o) * load(slope, n * OC + o) : load(dout, n * OC + o);
  dbias[o] += sum;
}

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n, bool accumulate) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) store(dst, i, (accumulate ? load(dst, i) : 0.0f) + load(src, i));
}

constexpr int kThreads = 256;

}  // namespace

void add_forward(Element type, void* out, const void* a, const void* b, int64_t n) {
  dispatch(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                                        static_cast<const T*>(b), n);
  });
  check_launch("add_forward");
}

void add_backward(Element type, void* da, void* db, const void* dout, int64_t n, bool accumulate_a,
                  bool accumulate_b) {
  dispatch(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
        static_cast<T*>(da), static_cast<T*>(db), static_cast<const T*>(dout), n, accumulate_a, accumulate_b);
  });
  check_launch("add_backward");
}

void finish_product(const float* sums, const float* bias, bool gelu, Element out_type, void* out, void* slope,
                    int64_t N, int64_t OC) {
  dispatch(out_type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    finish_product_kernel<<<blocks_for(N * OC, kThreads), kThreads, 0, stream()>>>(
        sums, bias, gelu, static_cast<T*>(out), static_cast<T*>(slope), N, OC);
  });
  check_launch("matmul bias and GELU");
}

void output_gradient(Element dout_type, const void* dout, const void* slope, Element grad_type, void* grad,
                     float* dbias, int64_t N, int64_t OC) {
  dispatch(dout_type, [&](auto* dout_tag) {
    using D = std::remove_pointer_t<decltype(dout_tag)>;
    dispatch(grad_type, [&](auto* grad_tag) {
      using G = std::remove_pointer_t<decltype(grad_tag)>;
      // The column sums first: grad may overwrite dout.
      if (dbias != nullptr) {
        column_sums_kernel<<<blocks_for(OC, kThreads), kThreads, 0, stream()>>>(
            dbias, static_cast<const D*>(dout), static_cast<const D*>(slope), N, OC);
      }
      if (static_cast<const void*>(grad) != dout || slope != nullptr) {
        output_gradient_kernel<<<blocks_for(N * OC, kThreads), kThreads, 0, stream()>>>(
            static_cast<const D*>(dout), static_cast<const D*>(slope), static_cast<G*>(grad), N, OC);
      }
    });
  });
  check_launch("matmul output gradient");
}

void cast(Element src_type, const void* src, Element dst_type, void* dst, int64_t n, bool accumulate) {
  dispatch(src_type, [&](auto* src_tag) {
    using S = std::remove_pointer_t<decltype(src_tag)>;
    dispatch(dst_type, [&](auto* dst_tag) {
      using D = std::remove_pointer_t<decltype(dst_tag)>;
      cast_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(static_cast<const S*>(src), static_cast<D*>(dst), n,
                                                                   accumulate);
    });
  });
  check_launch("cast");
}

}  // namespace paraflow::cuda
