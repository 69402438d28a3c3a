#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cpu/fast_math.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/storage.h"

namespace paraflow::cpu {

namespace {

template <typename T>
void add_forward_as(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <typename T>
void add_backward_as(T* da, T* db, const T* dout, int64_t n, bool accumulate_a, bool accumulate_b) {
  if (da == nullptr || db == nullptr) {  // one side takes no gradient (a value no parameter feeds)
    T* d = da != nullptr ? da : db;
    if (d == nullptr) return;
    const bool accumulate = da != nullptr ? accumulate_a : accumulate_b;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = from_float<T>((accumulate ? to_float(d[i]) : 0.0f) + to_float(dout[i]));
    return;
  }
  if (da == db) {  // the same value on both sides (x + x): one buffer, two contributions
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      da[i] = from_float<T>((accumulate_a ? to_float(da[i]) : 0.0f) + 2.0f * to_float(dout[i]));
    }
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float g = to_float(dout[i]);
    da[i] = from_float<T>((accumulate_a ? to_float(da[i]) : 0.0f) + g);
    db[i] = from_float<T>((accumulate_b ? to_float(db[i]) : 0.0f) + g);
  }
}

}  // namespace

template <typename T>
void add_forward(const AddForward& args) {
  add_forward_as(pointer<T>(args.out), pointer<T>(args.a), pointer<T>(args.b), args.out.numel());
}

template <typename T>
void add_backward(const AddBackward& args) {
  add_backward_as(pointer<T>(args.da), pointer<T>(args.db), pointer<T>(args.dout), args.dout.numel(),
                  args.accumulate_a, args.accumulate_b);
}

template void add_forward<float>(const AddForward&);
template void add_forward<BFloat16>(const AddForward&);
template void add_forward<Float16>(const AddForward&);
template void add_backward<float>(const AddBackward&);
template void add_backward<BFloat16>(const AddBackward&);
template void add_backward<Float16>(const AddBackward&);

namespace {

// A row of V logits: its maximum, and the sum of exp(x - max) (the whole vocabulary's, or one
// shard's part of it).
float row_max(const float* x, int64_t V) {
  float max_value = -INFINITY;
#pragma omp simd reduction(max : max_value)
  for (int64_t i = 0; i < V; ++i) max_value = x[i] > max_value ? x[i] : max_value;
  return max_value;
}

float sum_exp(const float* x, int64_t V, float max_value) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < V; ++i) sum += fast_exp(x[i] - max_value);
  return sum;
}

}  // namespace

void softmax_xent_forward(const SoftmaxXentForward& args) {
  const int64_t V = args.logits.shape()[args.logits.shape().rank() - 1], N = args.logits.numel() / V;
  const float* logits = pointer<float>(args.logits);
  const int32_t* targets = pointer<int32_t>(args.targets);
  float *losses = pointer<float>(args.losses), *stats = pointer<float>(args.stats);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    const float max_value = row_max(x, V);
    // The row is still in cache: this second pass costs no memory traffic.
    const float log_sum = std::log(sum_exp(x, V, max_value));
    stats[2 * n] = max_value;
    stats[2 * n + 1] = max_value + log_sum;
    int32_t target = targets[n];
    // -log p[target] from the logits directly keeps precision when p[target] is tiny.
    losses[n] = target < 0 ? 0.0f : log_sum - (x[target] - max_value);
  }
}

void softmax_xent_backward(const SoftmaxXentBackward& args) {
  const int64_t V = args.logits.shape()[args.logits.shape().rank() - 1], N = args.logits.numel() / V;
  const float *logits = pointer<float>(args.logits), *stats = pointer<float>(args.stats);
  const float* dlosses = pointer<float>(args.dlosses);
  const int32_t* targets = pointer<int32_t>(args.targets);
  float* dlogits = pointer<float>(args.dlogits);
  const bool accumulate = args.accumulate;
  const int64_t vocab_begin = args.vocab_begin;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t target = targets[n];
    const float dloss = target < 0 ? 0.0f : dlosses[n];
    const float log_normalizer = stats[2 * n + 1];
    const float* x = logits + n * V;
    float* d = dlogits + n * V;
    if (accumulate) {
#pragma omp simd
      for (int64_t i = 0; i < V; ++i) d[i] += fast_exp(x[i] - log_normalizer) * dloss;
    } else {
#pragma omp simd
      for (int64_t i = 0; i < V; ++i) d[i] = fast_exp(x[i] - log_normalizer) * dloss;
    }
    const int64_t column = static_cast<int64_t>(target) - vocab_begin;
    if (target >= 0 && column >= 0 && column < V) d[column] -= dloss;
  }
}

void xent_row_max(const XentRowMax& args) {
  const int64_t V = args.logits.shape()[args.logits.shape().rank() - 1], N = args.logits.numel() / V;
  const float* logits = pointer<float>(args.logits);
  float* max = pointer<float>(args.max);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) max[n] = row_max(logits + n * V, V);
}

void xent_sum_exp(const XentSumExp& args) {
  const int64_t V = args.logits.shape()[args.logits.shape().rank() - 1], N = args.logits.numel() / V;
  const float *logits = pointer<float>(args.logits), *max = pointer<float>(args.max);
  const int32_t* targets = pointer<int32_t>(args.targets);
  float* sums = pointer<float>(args.sums);
  const int64_t vocab_begin = args.vocab_begin;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    const int64_t column = static_cast<int64_t>(targets[n]) - vocab_begin;
    sums[2 * n] = sum_exp(x, V, max[n]);
    sums[2 * n + 1] = targets[n] >= 0 && column >= 0 && column < V ? x[column] : 0.0f;
  }
}

void xent_finish(const XentFinish& args) {
  const int64_t N = args.losses.numel();
  const float *max = pointer<float>(args.max), *sums = pointer<float>(args.sums);
  const int32_t* targets = pointer<int32_t>(args.targets);
  float *losses = pointer<float>(args.losses), *stats = pointer<float>(args.stats);
  for (int64_t n = 0; n < N; ++n) {
    const float log_sum = std::log(sums[2 * n]);
    stats[2 * n] = max[n];
    stats[2 * n + 1] = max[n] + log_sum;
    losses[n] = targets[n] < 0 ? 0.0f : log_sum - (sums[2 * n + 1] - max[n]);
  }
}

void sum_squares(const SumSquares& args) {
  const float* x = pointer<float>(args.x);
  const int64_t n = args.x.numel();
  // Fixed blocks, each summed in eight interleaved lanes (independent additions the compiler
  // vectorises, instead of one chain of dependent ones), and the blocks' sums added in order
  // afterwards: the same result for any thread count, with the threads never waiting on each other.
  constexpr int64_t kBlock = 1 << 14, kLanes = 8;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> block_sums(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kBlock, end = std::min(begin + kBlock, n);
    double lanes[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] += static_cast<double>(x[i + lane]) * x[i + lane];
    for (int64_t lane = 0; i < end; ++i, ++lane) lanes[lane] += static_cast<double>(x[i]) * x[i];
    double sum = 0.0;
    for (double lane : lanes) sum += lane;
    block_sums[static_cast<size_t>(block)] = sum;
  }
  double total = 0.0;
  for (double sum : block_sums) total += sum;
  *args.result = total;
}

namespace {

// Copy: the type of the 16-bit weight copy the step also writes, or void for none.
template <typename Copy>
void adamw_update_as(const AdamWUpdate& args, Copy* copy) {
  const AdamWParams& params = args.params;
  const int64_t n = args.param.numel();
  float *param = pointer<float>(args.param), *m = pointer<float>(args.m), *v = pointer<float>(args.v);
  const float* grad = pointer<float>(args.grad);
  // torch.optim.AdamW: decay first, then the bias-corrected Adam step.
  const float decay = 1.0f - params.lr * params.weight_decay;
  const float correction1 = 1.0f - static_cast<float>(std::pow(params.beta1, static_cast<double>(params.step)));
  const float correction2_sqrt =
      std::sqrt(1.0f - static_cast<float>(std::pow(params.beta2, static_cast<double>(params.step))));
  const float step_size = params.lr / correction1;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * params.grad_scale;
    m[i] = params.beta1 * m[i] + (1.0f - params.beta1) * g;
    v[i] = params.beta2 * v[i] + (1.0f - params.beta2) * g * g;
    float denominator = std::sqrt(v[i]) / correction2_sqrt + params.eps;
    param[i] = param[i] * decay - step_size * m[i] / denominator;
    if constexpr (!std::is_void_v<Copy>) copy[i] = from_float<Copy>(param[i]);
  }
}

}  // namespace

void adamw_update(const AdamWUpdate& args) {
  switch (args.param_copy.defined() ? args.param_copy.dtype() : DType::f32) {
    case DType::bf16: adamw_update_as(args, pointer<BFloat16>(args.param_copy)); break;
    case DType::f16: adamw_update_as(args, pointer<Float16>(args.param_copy)); break;
    default: adamw_update_as<void>(args, nullptr);
  }
}

}  // namespace paraflow::cpu
