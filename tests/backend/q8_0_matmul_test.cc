// The CPU's Q8_0 matmul (backend/cpu/q8_0_products.h) against double-precision references: the
// exact product of the quantized rows and the quantized weights (what the kernel computes, up to
// f32 rounding), and the f32 rows times the dequantized weights (what it approximates: the rows'
// own quantization error bounded value by value). Each row's result is the same alone or batched.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "tensor/quantized.h"
#include "test_util.h"

namespace paraflow {
namespace {

using testing::random_vector;
using Vec = std::vector<double>;

std::vector<float> to_floats(const Vec& values) { return std::vector<float>(values.begin(), values.end()); }

// A GELU (tanh form) in double, as the kernels apply it.
double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

TEST(Q8_0Matmul, MatchesTheExactProductOfItsBlocksAndIsRowInvariant) {
  Backend& backend = cpu_backend();
  ASSERT_TRUE(backend.supports(KernelOp::matmul_forward, DType::q8_0));
  Rng rng(testing::test_seed());
  const int64_t N = 7;
  for (auto [C, OC] : {std::pair{int64_t{96}, int64_t{91}}, std::pair{int64_t{800}, int64_t{133}}}) {
    for (bool with_gelu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "C=" << C << " OC=" << OC << (with_gelu ? " gelu" : ""));
      const std::vector<float> x = to_floats(random_vector(rng, N * C, 2.0)), w = to_floats(random_vector(rng, OC * C, 0.2));
      const std::vector<float> b = to_floats(random_vector(rng, OC));
      Tensor weight = backend.empty({OC, C}, DType::q8_0);
      quantize_q8_0(w.data(), weight.data<BlockQ8_0>(), OC * C);
      std::vector<BlockQ8_0> x_blocks(static_cast<size_t>(N * C / 32));
      quantize_q8_0(x.data(), x_blocks.data(), N * C);
      std::vector<float> w_back(w.size()), x_back(x.size());
      dequantize_q8_0(weight.data<BlockQ8_0>(), w_back.data(), OC * C);
      dequantize_q8_0(x_blocks.data(), x_back.data(), N * C);

      auto run = [&](int64_t first, int64_t rows) {
        Tensor out = backend.empty({rows, OC}, DType::f32);
        Tensor inp = backend.upload(std::vector<float>(x.begin() + first * C, x.begin() + (first + rows) * C), {rows, C}, DType::f32);
        backend.launch(MatmulForward{.out = out, .inp = inp, .weight = weight, .bias = backend.upload(b, {OC}, DType::f32),
                                     .layout = WeightLayout::out_in, .gelu = with_gelu, .row_invariant = true});
        return backend.download<float>(out);
      };
      const std::vector<float> batched = run(0, N);
      for (int64_t row : {int64_t{0}, int64_t{3}, N - 1}) {
        const std::vector<float> alone = run(row, 1);
        for (int64_t o = 0; o < OC; ++o) ASSERT_EQ(alone[o], batched[row * OC + o]) << "row " << row << " output " << o;
      }
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t o = 0; o < OC; ++o) {
          double blocks_exact = 0, sum_abs = 0, f32_rows = 0, rows_error = 0;
          for (int64_t c = 0; c < C; ++c) {
            const size_t xi = static_cast<size_t>(n * C + c), wi = static_cast<size_t>(o * C + c);
            blocks_exact += static_cast<double>(x_back[xi]) * w_back[wi];
            sum_abs += std::fabs(static_cast<double>(x_back[xi]) * w_back[wi]);
            f32_rows += static_cast<double>(x[xi]) * w_back[wi];
            rows_error += std::fabs(static_cast<double>(x_back[xi]) - x[xi]) * std::fabs(w_back[wi]);
          }
          const double got = batched[static_cast<size_t>(n * OC + o)], bias = b[static_cast<size_t>(o)];
          // f32 sums of C / 32 scaled block sums in 8 lanes, then the lanes: one rounding per
          // step, of at most 2^-24 of the magnitudes summed; GELU's fast tanh, 2^-20 relative.
          const double pre = blocks_exact + bias;
          const double rounding = (static_cast<double>(C / 32) + 8) * 0x1.0p-24 * (sum_abs + std::fabs(bias));
          const double expected = with_gelu ? gelu(pre) : pre;
          const double slope_bound = with_gelu ? 1.2 : 1.0;  // |GELU'| < 1.13
          ASSERT_LE(std::fabs(got - expected), slope_bound * rounding + 0x1.0p-20 * std::fabs(expected) + 1e-6)
              << "row " << n << " output " << o;
          if (!with_gelu) {
            // Against the f32 rows times the dequantized weights: off by the rows' quantization.
            ASSERT_LE(std::fabs(got - (f32_rows + bias)), rows_error + rounding) << "row " << n << " output " << o;
          }
        }
      }
    }
  }
}

TEST(Q8_0Matmul, RefusesWeightsThatAreNotWholeBlocksOfOutInRows) {
  Backend& backend = cpu_backend();
  Tensor weight = backend.empty({32, 64}, DType::q8_0);
  Tensor inp = backend.empty({2, 64}, DType::f32), out = backend.empty({2, 32}, DType::f32);
  EXPECT_THROW(backend.launch(MatmulForward{.out = out, .inp = inp, .weight = weight, .layout = WeightLayout::in_out}),
               Error);
  EXPECT_NO_THROW(backend.launch(MatmulForward{.out = out, .inp = inp, .weight = weight, .layout = WeightLayout::out_in}));
}

}  // namespace
}  // namespace paraflow
