#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cpu/avx2.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/storage.h"

namespace paraflow::cpu {

// One (batch, head) pair per iteration; its GEMMs run single-threaded inside the parallel loop.
// q, k and v are read in place from qkv (row stride 3C), in f32 or, under mixed_bfloat16, in bf16:
// then every product takes bf16 operands (oneDNN's matmul, f32 sums), the softmax runs in f32, and
// its probabilities and the scores' gradients are rounded to bf16 as the next product's operand.
// Causal blocking: rows are taken in blocks of kBlock, and a block only multiplies against the
// keys it can see (columns up to its last row), which skips ~3/8 of the T x T work at T = 4
// blocks. No T x T matrix is kept: a row block's scores live in a (kBlock, T) scratch buffer, the
// forward pass saves each row's log-sum-exp of the scaled scores, and the backward pass
// recomputes the block's probabilities from it (one more q·k^T product; at T = 1024 the
// probabilities were 37% of a GPT-2 124M's planned activations).

namespace {

constexpr int64_t kBlock = kAttentionBlockRows;

// C (M,N) = op(A) · op(B), or added to C, with f32 sums: sgemm in f32, oneDNN's bf16 matmul in bf16.
void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  sgemm(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}
template <typename Out>  // float, or BFloat16 (rounded once)
void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const BFloat16* A, int64_t lda,
             const BFloat16* B, int64_t ldb, bool accumulate, Out* C, int64_t ldc) {
  gemm_bf16(trans_a, trans_b, M, N, K, reinterpret_cast<const uint16_t*>(A), lda, reinterpret_cast<const uint16_t*>(B),
            ldb, nullptr, accumulate, C, std::is_same_v<Out, float> ? DType::f32 : DType::bf16, ldc);
}

// The unscaled scores of rows [r0, r1) against keys [0, r1) into `scores` (f32, row stride T).
template <typename E>
void block_scores(float* scores, const E* q, const E* k, int64_t ld, int64_t r0, int64_t r1, int64_t T, int64_t hs) {
  product(false, true, r1 - r0, r1, hs, q + r0 * ld, ld, k, ld, false, scores, T);
}

// One head's q, k, v (T, hs) of element type E with row stride ld, its output with row stride
// out_ld, and its rows' log-sum-exp of the scaled scores (T). `scores` is a (kBlock, T) f32
// scratch buffer and `probs` an E one (in f32 the same buffer: the probabilities overwrite the
// scores they come from).
template <typename E>
void attend_head(E* out, int64_t out_ld, float* logsumexp, float* scores, E* probs, const E* q, const E* k,
                 const E* v, int64_t ld, int64_t T, int64_t hs, float scale) {
  for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
    const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0, visible = r1;
    block_scores(scores, q, k, ld, r0, r1, T, hs);
    for (int64_t t = r0; t < r1; ++t) {
      float* row = scores + (t - r0) * T;
      E* prow = probs + (t - r0) * T;
      float max_value = -INFINITY;
#pragma omp simd reduction(max : max_value)
      for (int64_t j = 0; j <= t; ++j) max_value = row[j] > max_value ? row[j] : max_value;
      const float offset = scale * max_value;  // scale > 0: the largest scaled score
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j <= t; ++j) {
        row[j] = fast_exp(scale * row[j] - offset);
        sum += row[j];
      }
      logsumexp[t] = offset + std::log(sum);
      const float inverse = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j <= t; ++j) prow[j] = from_float<E>(row[j] * inverse);
      std::fill(prow + t + 1, prow + visible, from_float<E>(0.0f));
    }
    // out[r0:r1] = probs[r0:r1, 0:visible] · v[0:visible]
    product(false, false, rows, hs, visible, probs, T, v, ld, false, out + r0 * out_ld, out_ld);
  }
}

// The gradients of one head: dq, dk, dv (f32) with row stride dld, assigned or (accumulate)
// added to; dy with row stride dy_ld. `scores` and `dprobs` are (kBlock, T) f32 scratch buffers,
// `probs` and `dscores` E ones (in f32 the same two buffers). dk and dv take accumulate_kv: under
// grouped-query attention the group's other q heads have written them.
template <typename E>
void attend_head_backward(float* dq, float* dk, float* dv, int64_t dld, const E* dy, int64_t dy_ld, const E* q,
                          const E* k, const E* v, int64_t ld, const float* logsumexp, float* scores, float* dprobs,
                          E* probs, E* dscores, int64_t T, int64_t hs, float scale, bool accumulate,
                          bool accumulate_kv) {
  for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
    const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0, visible = r1;
    const E* dy_block = dy + r0 * dy_ld;
    // dprobs = dout · v^T over the visible keys
    product(false, true, rows, visible, hs, dy_block, dy_ld, v, ld, false, dprobs, T);
    // The block's probabilities again, exp(scaled score - log-sum-exp), and in the same pass the
    // softmax backward's sum(probs * dprobs); then the scaled scores' gradient
    // scale * probs * (dprobs - that sum), which the products below take for q·k^T's.
    block_scores(scores, q, k, ld, r0, r1, T, hs);
    for (int64_t t = r0; t < r1; ++t) {
      float* row = scores + (t - r0) * T;
      const float* drow = dprobs + (t - r0) * T;
      E *prow = probs + (t - r0) * T, *dsrow = dscores + (t - r0) * T;
      const float offset = logsumexp[t];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= t; ++j) {
        row[j] = fast_exp(scale * row[j] - offset);
        dot += row[j] * drow[j];
      }
#pragma omp simd
      for (int64_t j = 0; j <= t; ++j) {  // (in f32 dsrow is drow, read first, and prow is row)
        dsrow[j] = from_float<E>(scale * row[j] * (drow[j] - dot));
        if constexpr (!std::is_same_v<E, float>) prow[j] = from_float<E>(row[j]);
      }
      std::fill(prow + t + 1, prow + visible, from_float<E>(0.0f));
      std::fill(dsrow + t + 1, dsrow + visible, from_float<E>(0.0f));
    }
    // dv[0:visible] += probs^T · dout: keys [0, r0) were written by earlier blocks; keys
    // [r0, r1) are written first here, so they take the caller's accumulate/assign choice.
    product(true, false, r0, hs, rows, probs, T, dy_block, dy_ld, true, dv, dld);
    product(true, false, rows, hs, rows, probs + r0, T, dy_block, dy_ld, accumulate_kv, dv + r0 * dld, dld);
    // dq[r0:r1] = dscores · k (its only writer) ; dk[0:visible] += dscores^T · q
    product(false, false, rows, hs, visible, dscores, T, k, ld, accumulate, dq + r0 * dld, dld);
    product(true, false, r0, hs, rows, dscores, T, q + r0 * ld, ld, true, dk, dld);
    product(true, false, rows, hs, rows, dscores + r0, T, q + r0 * ld, ld, accumulate_kv, dk + r0 * dld, dld);
  }
}

// q's NH heads, then k's and v's KVH heads each, of hs values: a row of W = (NH + 2·KVH)·hs.
struct AttentionDims {
  int64_t B, T, NH, KVH, hs, W;
  int64_t group() const { return NH / KVH; }  // q heads per k/v head
  int64_t k_offset(int64_t kv_head) const { return (NH + kv_head) * hs; }
  int64_t v_offset(int64_t kv_head) const { return (NH + KVH + kv_head) * hs; }
};

template <typename Args>
AttentionDims dims_of(const Args& args) {
  const int64_t KVH = args.n_kv_head > 0 ? args.n_kv_head : args.n_head, W = args.qkv.shape()[2];
  return {args.qkv.shape()[0], args.qkv.shape()[1], args.n_head, KVH, W / (args.n_head + 2 * KVH), W};
}

// f32 rows of `count` values (dense) rounded into bf16 ones with row stride `ld`, or added to what
// those hold (rounded once).
void store_rows(BFloat16* to, const float* from, int64_t rows, int64_t count, int64_t ld, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) {
      const float value = from[r * count + i] + (accumulate ? to_float(to[r * ld + i]) : 0.0f);
      to[r * ld + i] = from_float<BFloat16>(value);
    }
  }
}

// A (kBlock, T) scratch buffer of element type E per thread: in f32 none, the f32 one serving.
template <typename E>
struct RoundedBlock {
  explicit RoundedBlock(int64_t T) : values(std::is_same_v<E, float> ? 0 : static_cast<size_t>(kBlock * T)) {}
  E* or_else(float* f32) {
    if constexpr (std::is_same_v<E, float>) return f32;
    return values.data();
  }
  std::vector<E> values;
};

template <typename E>
void attention_forward_of(const AttentionForward& args) {
  const AttentionDims d = dims_of(args);
  const E* qkv = pointer<E>(args.qkv);
  E* out = pointer<E>(args.out);
  float* logsumexp = pointer<float>(args.logsumexp);
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(kBlock * d.T));
    RoundedBlock<E> probs(d.T);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < d.B * d.NH; ++bh) {
      const int64_t b = bh / d.NH, h = bh % d.NH, kv = h / d.group();
      const E* row = qkv + b * d.T * d.W;
      attend_head(out + b * d.T * d.NH * d.hs + h * d.hs, d.NH * d.hs, logsumexp + bh * d.T, scores.data(),
                  probs.or_else(scores.data()), row + h * d.hs, row + d.k_offset(kv), row + d.v_offset(kv), d.W, d.T,
                  d.hs, args.scale);
    }
  }
}

template <typename E>
void attention_backward_of(const AttentionBackward& args) {
  const AttentionDims d = dims_of(args);
  const E *qkv = pointer<E>(args.qkv), *dout = pointer<E>(args.dout);
  E* dqkv = pointer<E>(args.dqkv);
  const float* logsumexp = pointer<float>(args.logsumexp);
  constexpr bool f32 = std::is_same_v<E, float>;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(kBlock * d.T)), dprobs(static_cast<size_t>(kBlock * d.T));
    RoundedBlock<E> probs(d.T), dscores(d.T);
    // In bf16 a head's dq, dk, dv are summed in f32 and rounded once; in f32 they go to dqkv.
    std::vector<float> staged(f32 ? 0 : static_cast<size_t>(3 * d.T * d.hs));
    // One (batch, k/v head) pair per iteration: its group of q heads add to the same dk and dv.
#pragma omp for schedule(static)
    for (int64_t bkv = 0; bkv < d.B * d.KVH; ++bkv) {
      const int64_t b = bkv / d.KVH, kv = bkv % d.KVH;
      const E* row = qkv + b * d.T * d.W;
      E* drow = dqkv + b * d.T * d.W;
      for (int64_t h = kv * d.group(); h < (kv + 1) * d.group(); ++h) {
        const bool first = h == kv * d.group();
        const E* dy = dout + b * d.T * d.NH * d.hs + h * d.hs;
        float *dq = staged.data(), *dk = dq + d.T * d.hs, *dv = dk + d.T * d.hs;
        int64_t dld = d.hs;
        if constexpr (f32) {
          dq = drow + h * d.hs, dk = drow + d.k_offset(kv), dv = drow + d.v_offset(kv), dld = d.W;
        }
        attend_head_backward(dq, dk, dv, dld, dy, d.NH * d.hs, row + h * d.hs, row + d.k_offset(kv),
                             row + d.v_offset(kv), d.W, logsumexp + (b * d.NH + h) * d.T, scores.data(), dprobs.data(),
                             probs.or_else(scores.data()), dscores.or_else(dprobs.data()), d.T, d.hs, args.scale,
                             f32 && args.accumulate_dqkv, (f32 && args.accumulate_dqkv) || !first);
        if constexpr (!f32) store_rows(drow + h * d.hs, dq, d.T, d.hs, d.W, args.accumulate_dqkv);
      }
      if constexpr (!f32) {
        store_rows(drow + d.k_offset(kv), staged.data() + d.T * d.hs, d.T, d.hs, d.W, args.accumulate_dqkv);
        store_rows(drow + d.v_offset(kv), staged.data() + 2 * d.T * d.hs, d.T, d.hs, d.W, args.accumulate_dqkv);
      }
    }
  }
}

}  // namespace

void attention_forward(const AttentionForward& args) { attention_forward_of<float>(args); }
void attention_backward(const AttentionBackward& args) { attention_backward_of<float>(args); }
// qkv, out, dout and dqkv bf16 (the 16-bit activations of mixed_bfloat16); logsumexp f32.
void attention_forward_bf16(const AttentionForward& args) { attention_forward_of<BFloat16>(args); }
void attention_backward_bf16(const AttentionBackward& args) { attention_backward_of<BFloat16>(args); }

// Decoding's attention: one query row per (token, head) against its cached keys and values.
// The generator's contiguous cache and the engine's paged one share these steps, so that the two
// give a sequence the same bits: a key's score and a value's weight are computed the same way
// however the keys are grouped (blocks of a paged cache, or one run of a contiguous one).
namespace {

// Asks for the cache lines of [from, from + bytes) to be brought into L2 (a hint: it never faults).
inline void prefetch_into_l2(const void* from, int64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(from), end = begin + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = begin / 64 * 64; line < end; line += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);  // (prefetcht1 on x86)
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The widest f32 vector the build has: 16 lanes with AVX-512, else 8. A value column's weighted
// sum is a chain of its own whatever the width, so the width changes none of its bits; a key's
// score sums its lanes, so a 16-lane chain is folded to 8 lanes (lane l + lane l + 8) before the
// 8-lane tree below. Every path (one row or a tile, paged or contiguous) takes the same steps.
#ifdef __AVX512F__
using Wide = __m512;
constexpr int64_t kWide = 16;
inline Wide wide_zero() { return _mm512_setzero_ps(); }
inline Wide wide_set1(float value) { return _mm512_set1_ps(value); }
template <typename T>  // f32 or bf16 (avx2.h)
inline Wide wide_load(const T* from) {
  return load16(from);
}
inline Wide wide_fmadd(Wide a, Wide b, Wide c) { return _mm512_fmadd_ps(a, b, c); }
inline void wide_store(float* to, Wide value) { _mm512_storeu_ps(to, value); }
inline __m256 fold(Wide lanes) {  // (zero-masked extracts, as in load16: GCC 12's casts warn too)
  const __m512d both = _mm512_castps_pd(lanes);
  return _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, both, 0)),
                       _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, both, 1)));
}
#else
using Wide = __m256;
constexpr int64_t kWide = 8;
inline Wide wide_zero() { return _mm256_setzero_ps(); }
inline Wide wide_set1(float value) { return _mm256_set1_ps(value); }
template <typename T>  // f32 or bf16 (avx2.h)
inline Wide wide_load(const T* from) {
  return load8(from);
}
inline Wide wide_fmadd(Wide a, Wide b, Wide c) { return _mm256_fmadd_ps(a, b, c); }
inline void wide_store(float* to, Wide value) { _mm256_storeu_ps(to, value); }
inline __m256 fold(Wide lanes) { return lanes; }
#endif

// Lane j of the result is the sum of acc[j]'s lanes, by the same tree for every j:
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline __m256 lane_sums(const __m256 acc[8]) {
  const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}

// acc[j] = q · key j as 8 lane sums, for `Keys` consecutive key rows: one chain of FMAs per key
// over its kWide-column chunks in order (so a key's lanes do not depend on how many go together),
// folded to 8 lanes.
template <int Keys, typename KV>
inline void key_lanes(__m256* acc, const float* q, const KV* key, int64_t hs) {
  Wide wide[Keys];
#pragma GCC unroll 8
  for (int j = 0; j < Keys; ++j) wide[j] = wide_zero();
  for (int64_t c = 0; c < hs; c += kWide) {
    const Wide qv = wide_load(q + c);
#pragma GCC unroll 8
    for (int j = 0; j < Keys; ++j) wide[j] = wide_fmadd(qv, wide_load(key + j * hs + c), wide[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < Keys; ++j) acc[j] = fold(wide[j]);
}

// y[0, kWide Vectors) += Σ_j weights[j] · value_j, value by value in order, y kept in registers;
// `next` (or null) as in key_scores, a row at a time.
template <int Vectors, typename KV>
inline void add_weighted_slice(float* y, const float* weights, const KV* values, int64_t count, int64_t hs,
                               const KV* next) {
  Wide acc[Vectors];
#pragma GCC unroll 8
  for (int v = 0; v < Vectors; ++v) acc[v] = wide_load(y + kWide * v);
  for (int64_t j = 0; j < count; ++j) {
    if (next != nullptr) prefetch_into_l2(next + j * hs, kWide * Vectors * static_cast<int64_t>(sizeof(KV)));
    const Wide weight = wide_set1(weights[j]);
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) acc[v] = wide_fmadd(weight, wide_load(values + j * hs + kWide * v), acc[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < Vectors; ++v) wide_store(y + kWide * v, acc[v]);
}

// Eight keys' scores (the first n of `sums`) to scores[0, n), and into the running maximum
// `max_lanes` (lane by lane; `sums > max ? sums : max`, as a scalar max would fold them).
inline void store_scores(float* scores, __m256 sums, int64_t n, __m256& max_lanes) {
  if (n == 8) {
    _mm256_storeu_ps(scores, sums);
  } else {
    alignas(32) float part[8];
    _mm256_store_ps(part, sums);
    std::copy(part, part + n, scores);
    // Lanes past n repeat the first score, which is already in.
    sums = _mm256_blendv_ps(sums, _mm256_set1_ps(part[0]),
                            _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_ps(static_cast<float>(n)), _CMP_GE_OQ));
  }
  max_lanes = _mm256_max_ps(sums, max_lanes);
}

inline float lanes_max(__m256 lanes, float max_value) {
  alignas(32) float part[8];
  _mm256_store_ps(part, lanes);
  for (float value : part) max_value = value > max_value ? value : max_value;
  return max_value;
}
#endif

// scores[j] = scale · (q · key j) for the `count` key rows at `keys` (row stride hs); returns the
// largest of max_value and these scores. Keys and values are f32 or (the engine's bf16 KV cache)
// bf16, widened as they are read. `next` (or null): the rows read next, requested into L2 a few
// at a time as these are read.
template <typename KV>
float key_scores(float* scores, const float* q, const KV* keys, int64_t count, int64_t hs, float scale,
                 float max_value, const KV* next = nullptr) {
#if defined(__AVX2__) && defined(__FMA__)
  if (hs % kWide == 0) {
    // Eight keys at a time: eight independent FMA chains instead of one, then one reduction.
    __m256 max_lanes = _mm256_set1_ps(-INFINITY);
    for (int64_t first = 0; first < count; first += 8) {
      const int64_t n = std::min<int64_t>(8, count - first);
      __m256 acc[8];
      for (__m256& lanes : acc) lanes = _mm256_setzero_ps();
      const KV* key = keys + first * hs;
      if (next != nullptr) prefetch_into_l2(next + first * hs, n * hs * static_cast<int64_t>(sizeof(KV)));
      if (n == 8) {
        key_lanes<8>(acc, q, key, hs);
      } else {
        for (int64_t j = 0; j < n; ++j) key_lanes<1>(acc + j, q, key + j * hs, hs);
      }
      store_scores(scores + first, _mm256_mul_ps(lane_sums(acc), _mm256_set1_ps(scale)), n, max_lanes);
    }
    return lanes_max(max_lanes, max_value);
  }
#endif
  for (int64_t j = 0; j < count; ++j) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < hs; ++d) dot += q[d] * to_float(keys[j * hs + d]);
    scores[j] = dot * scale;
    max_value = scores[j] > max_value ? scores[j] : max_value;
  }
  return max_value;
}

// scores[j] = exp(scores[j] - max_value) / Σ_k exp(scores[k] - max_value) for j < count. The
// sum's order is written out (eight lanes, key j in lane j % 8, then a fixed tree) rather than
// left to a vectoriser, whose order may change with the buffer's alignment: paged and contiguous
// caches pass differently aligned buffers and must give a token the same bits. (This holds as
// long as the compiler may not reassociate floating-point sums: no -ffast-math.)
inline void softmax_in_place(float* scores, int64_t count, float max_value) {
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) scores[j] = fast_exp(scores[j] - max_value);
  float lanes[8] = {};
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    for (int lane = 0; lane < 8; ++lane) lanes[lane] += scores[j + lane];
  }
  for (int lane = 0; j < count; ++j, ++lane) lanes[lane] += scores[j];
  const float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
#pragma omp simd
  for (int64_t k = 0; k < count; ++k) scores[k] /= sum;
}

// y += Σ_j weights[j] · value j over the `count` value rows at `values` (row stride hs); `next`
// as in key_scores.
template <typename KV>
void add_weighted_values(float* y, const float* weights, const KV* values, int64_t count, int64_t hs,
                         const KV* next = nullptr) {
#if defined(__AVX2__) && defined(__FMA__)
  if (hs % kWide == 0) {
    int64_t d = 0;
    for (; d + 64 <= hs; d += 64) {
      add_weighted_slice<64 / kWide>(y + d, weights, values + d, count, hs, next ? next + d : nullptr);
    }
    for (; d < hs; d += kWide) add_weighted_slice<1>(y + d, weights, values + d, count, hs, next ? next + d : nullptr);
    return;
  }
#endif
  for (int64_t j = 0; j < count; ++j) {
#pragma omp simd
    for (int64_t d = 0; d < hs; ++d) y[d] += weights[j] * to_float(values[j * hs + d]);
  }
}

// A prompt chunk's rows go through their keys and values up to kQueries at a time: each key and
// value row is read once for all of them instead of once each (a long prompt's attention reads
// its cache from L3 for every row otherwise). Every (row, key) score and every (row, column) sum
// is the same chain of FMAs as above, so a row gets the same bits alone or in a tile.
constexpr int kQueries = 4;

// The rows of a tile against one run of keys (or values): row r's query, scores (from the run's
// first key on) and running maximum, and its output for the values.
struct QueryRows {
  int count = 0;
  const float* q[kQueries];
  float* scores[kQueries];
  float* max_value[kQueries];
  float* y[kQueries];
};

#if defined(__AVX2__) && defined(__FMA__)
// lanes[r][first + k] = row r's query · key k as 8 lane sums, for Keys consecutive keys; one
// chain per (row, key), as key_lanes.
template <int Queries, int Keys, typename KV>
inline void tile_key_lanes(__m256 (&lanes)[kQueries][8], int64_t first, const QueryRows& rows, const KV* key,
                           int64_t hs) {
  Wide acc[Queries][Keys];
#pragma GCC unroll 4
  for (int r = 0; r < Queries; ++r) {
#pragma GCC unroll 2
    for (int k = 0; k < Keys; ++k) acc[r][k] = wide_zero();
  }
  for (int64_t c = 0; c < hs; c += kWide) {
    Wide kv[Keys];
#pragma GCC unroll 2
    for (int k = 0; k < Keys; ++k) kv[k] = wide_load(key + k * hs + c);
#pragma GCC unroll 4
    for (int r = 0; r < Queries; ++r) {
      const Wide qv = wide_load(rows.q[r] + c);
#pragma GCC unroll 2
      for (int k = 0; k < Keys; ++k) acc[r][k] = wide_fmadd(qv, kv[k], acc[r][k]);
    }
  }
  for (int r = 0; r < Queries; ++r) {
    for (int k = 0; k < Keys; ++k) lanes[r][first + k] = fold(acc[r][k]);
  }
}

template <int Queries, typename KV>
void tile_key_scores(const QueryRows& rows, const KV* keys, int64_t count, int64_t hs, float scale) {
  __m256 max_lanes[Queries];
  for (__m256& lanes : max_lanes) lanes = _mm256_set1_ps(-INFINITY);
  for (int64_t first = 0; first < count; first += 8) {
    const int64_t n = std::min<int64_t>(8, count - first);
    __m256 lanes[kQueries][8];
    for (auto& row : lanes) {
      for (__m256& key : row) key = _mm256_setzero_ps();
    }
    const KV* key = keys + first * hs;
    int64_t k = 0;
    for (; k + 2 <= n; k += 2) tile_key_lanes<Queries, 2>(lanes, k, rows, key + k * hs, hs);
    if (k < n) tile_key_lanes<Queries, 1>(lanes, k, rows, key + k * hs, hs);
    for (int r = 0; r < Queries; ++r) {
      store_scores(rows.scores[r] + first, _mm256_mul_ps(lane_sums(lanes[r]), _mm256_set1_ps(scale)), n, max_lanes[r]);
    }
  }
  for (int r = 0; r < Queries; ++r) *rows.max_value[r] = lanes_max(max_lanes[r], *rows.max_value[r]);
}

// Row r's y[d, d + kWide Vectors) += Σ_j weights_r[j] · value_j, as add_weighted_slice.
template <int Queries, int Vectors, typename KV>
inline void tile_weighted_slice(const QueryRows& rows, const KV* values, int64_t count, int64_t hs, int64_t d) {
  Wide acc[Queries][Vectors];
#pragma GCC unroll 4
  for (int r = 0; r < Queries; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < Vectors; ++v) acc[r][v] = wide_load(rows.y[r] + d + kWide * v);
  }
  for (int64_t j = 0; j < count; ++j) {
    Wide value[Vectors];
#pragma GCC unroll 2
    for (int v = 0; v < Vectors; ++v) value[v] = wide_load(values + j * hs + d + kWide * v);
#pragma GCC unroll 4
    for (int r = 0; r < Queries; ++r) {
      const Wide weight = wide_set1(rows.scores[r][j]);
#pragma GCC unroll 2
      for (int v = 0; v < Vectors; ++v) acc[r][v] = wide_fmadd(weight, value[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < Queries; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < Vectors; ++v) wide_store(rows.y[r] + d + kWide * v, acc[r][v]);
  }
}

template <int Queries, typename KV>
void tile_weighted_values(const QueryRows& rows, const KV* values, int64_t count, int64_t hs) {
  int64_t d = 0;
  for (; d + 2 * kWide <= hs; d += 2 * kWide) tile_weighted_slice<Queries, 2>(rows, values, count, hs, d);
  for (; d < hs; d += kWide) tile_weighted_slice<Queries, 1>(rows, values, count, hs, d);
}
#endif

// `next` (or null), the run of keys (values) a tile reads after these `count`, requested into
// L2 meanwhile: for a single row, spread over its work (returned, for its kernel to request);
// for a tile, at once here (null returned).
template <typename KV>
const KV* request_next_run(const QueryRows& rows, const KV* next, int64_t count, int64_t hs) {
  if (rows.count == 1) return next;
  if (next != nullptr) prefetch_into_l2(next, count * hs * static_cast<int64_t>(sizeof(KV)));
  return nullptr;
}

// A tile's scores against `count` keys, and its weighted sums of `count` values: several rows
// at once where the AVX2 kernels apply, row by row otherwise; `next` as in request_next_run.
template <typename KV>
void tile_scores(const QueryRows& rows, const KV* keys, int64_t count, int64_t hs, float scale, const KV* next) {
  const KV* spread = request_next_run(rows, next, count, hs);
#if defined(__AVX2__) && defined(__FMA__)
  if (hs % kWide == 0) {
    switch (rows.count) {
      case 4: return tile_key_scores<4>(rows, keys, count, hs, scale);
      case 3: return tile_key_scores<3>(rows, keys, count, hs, scale);
      case 2: return tile_key_scores<2>(rows, keys, count, hs, scale);
      default: break;
    }
  }
#endif
  for (int r = 0; r < rows.count; ++r) {
    *rows.max_value[r] = key_scores(rows.scores[r], rows.q[r], keys, count, hs, scale, *rows.max_value[r], spread);
  }
}

template <typename KV>
void tile_values(const QueryRows& rows, const KV* values, int64_t count, int64_t hs, const KV* next) {
  const KV* spread = request_next_run(rows, next, count, hs);
#if defined(__AVX2__) && defined(__FMA__)
  if (hs % kWide == 0) {
    switch (rows.count) {
      case 4: return tile_weighted_values<4>(rows, values, count, hs);
      case 3: return tile_weighted_values<3>(rows, values, count, hs);
      case 2: return tile_weighted_values<2>(rows, values, count, hs);
      default: break;
    }
  }
#endif
  for (int r = 0; r < rows.count; ++r) add_weighted_values(rows.y[r], rows.scores[r], values, count, hs, spread);
}

// This thread's scores, at least `count` of them: kept across calls (no allocation per token).
float* decode_scores(int64_t count) {
  thread_local std::vector<float> scores;
  if (scores.size() < static_cast<size_t>(count)) scores.resize(static_cast<size_t>(count));
  return scores.data();
}

}  // namespace

void attention_cached_forward(const AttentionCachedForward& args) {
  const AttentionDims d = dims_of(args);
  const int64_t B = d.B, Tn = d.T, NH = d.NH, KVH = d.KVH, hs = d.hs, W = d.W, C = NH * hs;
  const int64_t past = args.past, max_T = args.k_cache.shape()[2];
  const float* qkv = pointer<float>(args.qkv);
  float *out = pointer<float>(args.out), *k_cache = pointer<float>(args.k_cache), *v_cache = pointer<float>(args.v_cache);
  // The new keys and values first, once per k/v head (a group of q heads reads them).
#pragma omp parallel for schedule(static)
  for (int64_t bkv = 0; bkv < B * KVH; ++bkv) {
    const int64_t b = bkv / KVH, kv = bkv % KVH;
    for (int64_t t = 0; t < Tn; ++t) {
      const float* row = qkv + (b * Tn + t) * W;
      std::copy(row + d.k_offset(kv), row + d.k_offset(kv) + hs, k_cache + (bkv * max_T + past + t) * hs);
      std::copy(row + d.v_offset(kv), row + d.v_offset(kv) + hs, v_cache + (bkv * max_T + past + t) * hs);
    }
  }
#pragma omp parallel
  {
    float* scores = decode_scores(past + Tn);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH, bkv = b * KVH + h / d.group();
      const float* keys = k_cache + bkv * max_T * hs;    // (max_T, hs)
      const float* values = v_cache + bkv * max_T * hs;  // (max_T, hs)
      for (int64_t t = 0; t < Tn; ++t) {
        const float* q = qkv + (b * Tn + t) * W + h * hs;
        const int64_t visible = past + t + 1;
        softmax_in_place(scores, visible, key_scores(scores, q, keys, visible, hs, args.scale, -INFINITY));
        float* y = out + (b * Tn + t) * C + h * hs;
        std::fill(y, y + hs, 0.0f);
        add_weighted_values(y, scores, values, visible, hs);
      }
    }
  }
}

namespace {

// The pools' element type KV: f32, or bf16 (keys and values rounded as they are written).
template <typename KV>
void attention_paged(const AttentionPagedForward& args) {
  const AttentionDims d = dims_of(args);
  const int64_t N = d.B, NH = d.NH, KVH = d.KVH, hs = d.hs, W = d.W, C = NH * hs;
  const int64_t block_size = args.k_pool.shape()[2], max_blocks = args.block_tables.shape()[1];
  const int32_t* positions = args.positions.data<int32_t>();
  const int32_t* tables = args.block_tables.data<int32_t>();
  const float* qkv = pointer<float>(args.qkv);
  float* out = pointer<float>(args.out);
  KV *k_pool = pointer<KV>(args.k_pool), *v_pool = pointer<KV>(args.v_pool);
  // Row (block, kv, slot) of a pool: where position p of token i's sequence keeps k/v head kv.
  auto kv_row = [&](int64_t i, int64_t kv, int64_t p) {
    const int64_t block = tables[i * max_blocks + p / block_size];
    return ((block * KVH + kv) * block_size + p % block_size) * hs;
  };
  // The k/v head that q head h reads.
  auto pool_row = [&](int64_t i, int64_t h, int64_t p) { return kv_row(i, h / d.group(), p); };
  // Every token's key and value first, so that tokens of one sequence see each other's.
#pragma omp parallel for schedule(static)
  for (int64_t ikv = 0; ikv < N * KVH; ++ikv) {
    const int64_t i = ikv / KVH, kv = ikv % KVH;
    const float* row = qkv + i * W;
    const int64_t at = kv_row(i, kv, positions[i]);
    for (int64_t c = 0; c < hs; ++c) {
      k_pool[at + c] = from_float<KV>(row[d.k_offset(kv) + c]);
      v_pool[at + c] = from_float<KV>(row[d.v_offset(kv) + c]);
    }
  }
  // Tiles: up to kQueries consecutive rows at consecutive positions whose block tables agree on
  // every block the first of them sees (a prompt chunk's rows): over those keys they read the
  // same memory, together; each row's later keys it reads alone.
  if (N == 0) return;
  thread_local std::vector<int64_t> tile_buffer;  // kept across calls (no allocation per token)
  std::vector<int64_t>& tiles = tile_buffer;       // the calling thread's, for every thread below
  tiles.clear();  // each tile's first row, then N
  for (int64_t i = 0; i < N;) {
    tiles.push_back(i);
    const int32_t* table = tables + i * max_blocks;
    const int64_t shared_blocks = positions[i] / block_size + 1;
    int64_t n = 1;
    while (n < kQueries && i + n < N && positions[i + n] == positions[i] + n &&
           std::equal(table, table + shared_blocks, tables + (i + n) * max_blocks)) {
      ++n;
    }
    i += n;
  }
  tiles.push_back(N);
  const auto tile_count = static_cast<int64_t>(tiles.size()) - 1;
  // A tile's heads in one iteration: a block holds every k/v head's keys (and values) in one
  // contiguous run, which the hardware prefetcher follows; head by head, a tile would jump
  // between runs of a few KiB. Only with fewer tiles than twice the threads are a tile's heads
  // split into parts (contiguous runs still), so that every thread has work.
  const int64_t stride = max_blocks * block_size;  // a (row, head)'s scores
  const int64_t parts = std::clamp<int64_t>((2 * omp_get_max_threads() + tile_count - 1) / tile_count, 1, NH);
#pragma omp parallel
  {
    float* scores = decode_scores(kQueries * NH * (stride + 1));
    float* max_values = scores + kQueries * NH * stride;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < tile_count * parts; ++item) {
      const int64_t tile = item / parts, h_begin = NH * (item % parts) / parts, h_end = NH * (item % parts + 1) / parts;
      const int64_t first_row = tiles[tile], rows = tiles[tile + 1] - first_row;
      const int64_t shared = positions[first_row] + 1;  // keys every row of the tile sees
      // Block by block, positions [begin, end) of row i's heads in a pool: visit(h, position, run,
      // count, next run or null). Blocks lie anywhere in the pool: a head's run in one is 2 KiB
      // (GPT-2's, bf16; 4 KiB in f32), too short for the hardware prefetcher, which also stops at
      // every 4 KiB page. So the kernels request each head's run in the next block into L2 while
      // they read this one's, a few lines per key or value row (decoding attention read a bf16
      // cache from memory at 19-28 GB/s without, 25-40 with: bench/infer/paged_attention_bench).
      auto each_block = [&](int64_t i, const KV* pool, int64_t begin, int64_t end, auto&& visit) {
        for (int64_t first = begin; first < end;) {
          const int64_t count = std::min(end, (first / block_size + 1) * block_size) - first;
          const int64_t next = first + count;
          for (int64_t h = h_begin; h < h_end; ++h) {
            visit(h, first, pool + pool_row(i, h, first), count, next < end ? pool + pool_row(i, h, next) : nullptr);
          }
          first = next;
        }
      };
      // The tile's rows [r0, r0 + count) for head h, from key (or value) `first` on.
      auto tile_rows = [&](int64_t r0, int64_t count, int64_t h, int64_t first) {
        QueryRows selected{.count = static_cast<int>(count)};
        for (int64_t k = 0; k < count; ++k) {
          const int64_t r = r0 + k, at = r * NH + h;
          selected.q[k] = qkv + (first_row + r) * W + h * hs;
          selected.scores[k] = scores + at * stride + first;
          selected.max_value[k] = max_values + at;
          selected.y[k] = out + (first_row + r) * C + h * hs;
        }
        return selected;
      };
      for (int64_t r = 0; r < rows; ++r) {
        std::fill(max_values + r * NH + h_begin, max_values + r * NH + h_end, -INFINITY);
        std::fill(out + (first_row + r) * C + h_begin * hs, out + (first_row + r) * C + h_end * hs, 0.0f);
      }
      each_block(first_row, k_pool, 0, shared,
                 [&](int64_t h, int64_t first, const KV* keys, int64_t count, const KV* next) {
                   tile_scores(tile_rows(0, rows, h, first), keys, count, hs, args.scale, next);
                 });
      for (int64_t r = 1; r < rows; ++r) {
        each_block(first_row + r, k_pool, shared, positions[first_row + r] + 1,
                   [&](int64_t h, int64_t first, const KV* keys, int64_t count, const KV* next) {
                     tile_scores(tile_rows(r, 1, h, first), keys, count, hs, args.scale, next);
                   });
      }
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = h_begin; h < h_end; ++h) {
          softmax_in_place(scores + (r * NH + h) * stride, positions[first_row + r] + 1, max_values[r * NH + h]);
        }
      }
      each_block(first_row, v_pool, 0, shared,
                 [&](int64_t h, int64_t first, const KV* values, int64_t count, const KV* next) {
                   tile_values(tile_rows(0, rows, h, first), values, count, hs, next);
                 });
      for (int64_t r = 1; r < rows; ++r) {
        each_block(first_row + r, v_pool, shared, positions[first_row + r] + 1,
                   [&](int64_t h, int64_t first, const KV* values, int64_t count, const KV* next) {
                     tile_values(tile_rows(r, 1, h, first), values, count, hs, next);
                   });
      }
    }
  }
}

}  // namespace

void attention_paged_forward(const AttentionPagedForward& args) {
  if (args.k_pool.dtype() == DType::bf16) {
    attention_paged<BFloat16>(args);
  } else {
    attention_paged<float>(args);
  }
}

}  // namespace paraflow::cpu
