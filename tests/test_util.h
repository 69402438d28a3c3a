// Helpers shared by the C++ tests: random tensors and norm-wise error measures.
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "backend/kernel_args.h"
#include "base/random.h"
#include "tensor/tensor.h"

namespace paraflow::testing {

// A fresh seed per run (printed, so a failure can be replayed with PARAFLOW_TEST_SEED).
inline uint64_t test_seed() {
  static uint64_t seed = [] {
    const char* fixed = std::getenv("PARAFLOW_TEST_SEED");
    uint64_t value = fixed ? std::strtoull(fixed, nullptr, 10) : std::random_device{}();
    std::printf("PARAFLOW_TEST_SEED=%llu\n", static_cast<unsigned long long>(value));
    return value;
  }();
  return seed;
}

// An [rows, columns] weight's values (row-major) arranged by a layout's offset function
// (interleaved_offset for out_in_interleaved, tiles_offset for out_in_tiles).
template <typename T>
std::vector<T> arranged(const std::vector<T>& plain, int64_t rows, int64_t columns,
                        int64_t (*offset)(int64_t, int64_t, int64_t, int64_t)) {
  std::vector<T> stored(plain.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      stored[static_cast<size_t>(offset(r, c, rows, columns))] = plain[static_cast<size_t>(r * columns + c)];
    }
  }
  return stored;
}

inline std::vector<double> random_vector(Rng& rng, int64_t n, double scale = 1.0) {
  std::vector<double> values(static_cast<size_t>(n));
  for (double& value : values) value = rng.normal() * scale;
  return values;
}

inline Tensor to_tensor(const std::vector<double>& values, Shape shape) {
  Tensor tensor = Tensor::zeros(std::move(shape), DType::f32);
  for (size_t i = 0; i < values.size(); ++i) tensor.data<float>()[i] = static_cast<float>(values[i]);
  return tensor;
}

inline std::vector<double> to_vector(const Tensor& tensor) {
  std::vector<double> values(static_cast<size_t>(tensor.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = tensor.data<float>()[i];
  return values;
}

// ‖actual − reference‖₂ / ‖reference‖₂
inline double relative_error(const std::vector<double>& actual, const std::vector<double>& reference) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    diff += (actual[i] - reference[i]) * (actual[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// Norm-wise bound for float32 results of length-K reductions: rounding errors of a sum of K
// terms grow like sqrt(K)·u with high probability (Higham & Mary, 2019); the factor 8 covers
// the few chained operations of one kernel (a GEMM then bias, GELU, or a softmax).
inline double f32_tolerance(int64_t reduction_length) {
  return 8.0 * FLT_EPSILON * std::sqrt(static_cast<double>(reduction_length));
}

#define EXPECT_CLOSE(actual, reference, reduction_length, what)                                           \
  do {                                                                                                    \
    double error_ = ::paraflow::testing::relative_error(actual, reference);                               \
    double bound_ = ::paraflow::testing::f32_tolerance(reduction_length);                                 \
    std::printf("  %-28s rel err %.3e (bound %.3e)\n", what, error_, bound_);                             \
    EXPECT_LE(error_, bound_) << what;                                                                    \
  } while (0)

}  // namespace paraflow::testing
