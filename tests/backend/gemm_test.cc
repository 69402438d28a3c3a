// The f32 GEMM engines (OpenBLAS's sgemm, oneDNN's sgemm, oneDNN's matmul primitive) against a
// float64 product of the same operands: every transposition, alpha and beta, leading dimensions
// wider than the matrices. The by-shape rule sends real training shapes to any of them, and the
// ops' tests run shapes too small for the rule to pick anything but oneDNN's sgemm.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"

namespace paraflow {
namespace {

struct GemmCase {
  bool trans_a, trans_b;
  float alpha, beta;
};

class GemmEngines : public testing::TestWithParam<cpu::GemmEngine> {
 protected:
  void TearDown() override { cpu::set_gemm_engine(cpu::GemmEngine::by_shape); }
};

TEST_P(GemmEngines, MatchFloat64OnEveryTranspositionAlphaAndBeta) {
  cpu::set_gemm_engine(GetParam());
  constexpr int64_t M = 37, N = 29, K = 53, kPad = 3;  // leading dimensions kPad wider than needed
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const GemmCase& c : {GemmCase{false, false, 1.0f, 0.0f}, GemmCase{true, false, 1.0f, 1.0f},
                            GemmCase{false, true, 0.5f, 0.25f}, GemmCase{true, true, -2.0f, 1.0f}}) {
    // op(A) is (M,K): stored (M,K) or, transposed, (K,M); likewise op(B) (K,N).
    const int64_t a_rows = c.trans_a ? K : M, a_cols = c.trans_a ? M : K;
    const int64_t b_rows = c.trans_b ? N : K, b_cols = c.trans_b ? K : N;
    const int64_t lda = a_cols + kPad, ldb = b_cols + kPad, ldc = N + kPad;
    std::vector<float> a(static_cast<size_t>(a_rows * lda)), b(static_cast<size_t>(b_rows * ldb)),
        out(static_cast<size_t>(M * ldc));
    for (float& x : a) x = uniform(rng);
    for (float& x : b) x = uniform(rng);
    for (float& x : out) x = uniform(rng);
    const std::vector<float> before = out;
    cpu::sgemm(c.trans_a, c.trans_b, M, N, K, c.alpha, a.data(), lda, b.data(), ldb, c.beta, out.data(), ldc);
    auto a_at = [&](int64_t m, int64_t k) { return static_cast<double>(c.trans_a ? a[k * lda + m] : a[m * lda + k]); };
    auto b_at = [&](int64_t k, int64_t n) { return static_cast<double>(c.trans_b ? b[n * ldb + k] : b[k * ldb + n]); };
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double dot = 0, magnitude = 0;
        for (int64_t k = 0; k < K; ++k) {
          dot += a_at(m, k) * b_at(k, n);
          magnitude += std::abs(a_at(m, k) * b_at(k, n));
        }
        const double old = before[static_cast<size_t>(m * ldc + n)];
        const double expected = c.alpha * dot + c.beta * old;
        // f32 sums of K products: within K ulps of the sum of magnitudes (and of the scaled C).
        const double bound = (std::abs(c.alpha) * magnitude + std::abs(c.beta * old)) * K * 0x1p-24 + 1e-30;
        ASSERT_NEAR(out[static_cast<size_t>(m * ldc + n)], expected, bound)
            << cpu::gemm_engine_name(GetParam()) << " trans_a " << c.trans_a << " trans_b " << c.trans_b << " at ("
            << m << ", " << n << ")";
      }
    }
    // The padding between rows of C is left alone.
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = N; n < ldc; ++n) {
        ASSERT_EQ(out[static_cast<size_t>(m * ldc + n)], before[static_cast<size_t>(m * ldc + n)]);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Each, GemmEngines,
                         testing::Values(cpu::GemmEngine::openblas, cpu::GemmEngine::onednn,
                                         cpu::GemmEngine::onednn_matmul),
                         [](const testing::TestParamInfo<cpu::GemmEngine>& info) {
                           return cpu::gemm_engine_name(info.param);
                         });

}  // namespace
}  // namespace paraflow
