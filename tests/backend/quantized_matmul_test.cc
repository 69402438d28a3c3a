// The CPU's block-quantized matmuls (backend/cpu/q8_0_products.h for Q8_0 and Q5_0, q4_k_products.h) against
// double-precision references: the exact product of the quantized rows and the quantized weights
// (what the kernel computes, up to f32 rounding), and the f32 rows times the dequantized weights
// (what it approximates: the rows' own quantization error bounded value by value). Each row's
// result is the same alone or batched. Weights stored [out, in] and, where the type has them and
// the CPU multiplies them (AVX512_VNNI), out_in_tiles (backend/quantized_tiles.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/quantize_rows.h"
#include "backend/quantized_tiles.h"
#include "tensor/quantized.h"
#include "test_util.h"

namespace paraflow {
namespace {

using testing::random_vector;
using Vec = std::vector<double>;

std::vector<float> to_floats(const Vec& values) { return std::vector<float>(values.begin(), values.end()); }

// A GELU (tanh form) in double, as the kernels apply it.
double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// A weight type, the blocks its kernel quantizes the input rows to, and shapes [in, out] that
// take whole blocks (one of a single block, one with several and an odd number of outputs).
struct Q8_0Case {
  static constexpr DType kType = DType::q8_0;
  using Weight = BlockQ8_0;
  using Rows = BlockQ8_0;
  static void quantize_rows(const float* x, Rows* rows, int64_t count) { quantize_q8_0(x, rows, count); }
  static void dequantize_rows(const Rows* rows, float* x, int64_t count) { dequantize_q8_0(rows, x, count); }
  static constexpr std::pair<int64_t, int64_t> kShapes[] = {{96, 91}, {800, 133}};
};
struct Q5_0Case {
  static constexpr DType kType = DType::q5_0;
  using Weight = BlockQ5_0;
  using Rows = BlockQ8_0;
  static void quantize_rows(const float* x, Rows* rows, int64_t count) { quantize_q8_0(x, rows, count); }
  static void dequantize_rows(const Rows* rows, float* x, int64_t count) { dequantize_q8_0(rows, x, count); }
  static constexpr std::pair<int64_t, int64_t> kShapes[] = {{96, 91}, {896, 133}};  // Qwen2.5-0.5B's rows of 896
};
struct Q4_KCase {
  static constexpr DType kType = DType::q4_k;
  using Weight = BlockQ4_K;
  using Rows = BlockQ8_K;
  static void quantize_rows(const float* x, Rows* rows, int64_t count) { quantize_q8_k(x, rows, count); }
  static void dequantize_rows(const Rows* rows, float* x, int64_t count) { dequantize_q8_k(rows, x, count); }
  static constexpr std::pair<int64_t, int64_t> kShapes[] = {{256, 91}, {1024, 133}};
};

// Each weight's magnitude as the kernel sums it: Q8_0's and Q5_0's d * q; Q4_K's d * scale * q
// and dmin * min are summed apart (their difference, the weight, may be much smaller), read as the
// blocks with dmin and then d set to zero.
template <typename Block>
std::vector<float> summed_magnitudes(const std::vector<Block>& blocks, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  dequantize_blocks(std::is_same_v<Block, BlockQ8_0> ? DType::q8_0 : DType::q5_0, blocks.data(), values.data(), count);
  for (float& value : values) value = std::fabs(value);
  return values;
}
std::vector<float> summed_magnitudes(std::vector<BlockQ4_K> blocks, int64_t count) {
  std::vector<float> scaled(static_cast<size_t>(count)), mins(scaled.size());
  std::vector<BlockQ4_K> parts = blocks;
  for (BlockQ4_K& block : parts) block.dmin = 0;
  dequantize_q4_k(parts.data(), scaled.data(), count);
  for (BlockQ4_K& block : blocks) block.d = 0;
  dequantize_q4_k(blocks.data(), mins.data(), count);
  for (size_t i = 0; i < scaled.size(); ++i) scaled[i] = std::fabs(scaled[i]) + std::fabs(mins[i]);
  return scaled;
}

template <typename Case>
class QuantizedMatmul : public ::testing::Test {};
using Cases = ::testing::Types<Q8_0Case, Q5_0Case, Q4_KCase>;
TYPED_TEST_SUITE(QuantizedMatmul, Cases);

TYPED_TEST(QuantizedMatmul, MatchesTheExactProductOfItsBlocksAndIsRowInvariant) {
  using Case = TypeParam;
  using Weight = typename Case::Weight;
  using Rows = typename Case::Rows;
  Backend& backend = cpu_backend();
  ASSERT_TRUE(backend.supports(KernelOp::matmul_forward, Case::kType));
  Rng rng(testing::test_seed());
  const int64_t N = 13;  // two blocks of rows in the tile products (6 and 7)
  std::vector<WeightLayout> layouts = {WeightLayout::out_in};
  if (has_quantized_tiles(Case::kType) && backend.prefers_tiled_weights(Case::kType)) {
    layouts.push_back(WeightLayout::out_in_tiles);
  }
  for (auto [C, OC] : Case::kShapes) {
    for (auto [with_gelu, layout] : {std::pair{false, layouts.front()}, std::pair{true, layouts.front()},
                                     std::pair{false, layouts.back()}, std::pair{true, layouts.back()}}) {
      SCOPED_TRACE(::testing::Message() << "C=" << C << " OC=" << OC << (with_gelu ? " gelu " : " ")
                                        << weight_layout_name(layout));
      const std::vector<float> x = to_floats(random_vector(rng, N * C, 2.0)), w = to_floats(random_vector(rng, OC * C, 0.2));
      const std::vector<float> b = to_floats(random_vector(rng, OC));
      Tensor weight = backend.empty({OC, C}, Case::kType);
      quantize_blocks(Case::kType, w.data(), weight.data<Weight>(), OC * C);
      std::vector<Rows> x_blocks(static_cast<size_t>(N * C / Rows::kElements));
      Case::quantize_rows(x.data(), x_blocks.data(), N * C);
      std::vector<float> w_back(w.size()), x_back(x.size());
      dequantize_blocks(Case::kType, weight.data<Weight>(), w_back.data(), OC * C);
      Case::dequantize_rows(x_blocks.data(), x_back.data(), N * C);
      const std::vector<Weight> w_blocks(weight.data<Weight>(), weight.data<Weight>() + OC * C / Weight::kElements);
      const std::vector<float> w_magnitude = summed_magnitudes(w_blocks, OC * C);
      if (layout == WeightLayout::out_in_tiles) tile_quantized_rows(Case::kType, weight.raw(), OC, C);

      auto run = [&](int64_t first, int64_t rows) {
        Tensor out = backend.empty({rows, OC}, DType::f32);
        Tensor inp = backend.upload(std::vector<float>(x.begin() + first * C, x.begin() + (first + rows) * C), {rows, C}, DType::f32);
        backend.launch(MatmulForward{.out = out, .inp = inp, .weight = weight, .bias = backend.upload(b, {OC}, DType::f32),
                                     .layout = layout, .gelu = with_gelu, .row_invariant = true});
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
            sum_abs += std::fabs(static_cast<double>(x_back[xi])) * w_magnitude[wi];
            f32_rows += static_cast<double>(x[xi]) * w_back[wi];
            rows_error += std::fabs(static_cast<double>(x_back[xi]) - x[xi]) * std::fabs(w_back[wi]);
          }
          const double got = batched[static_cast<size_t>(n * OC + o)], bias = b[static_cast<size_t>(o)];
          // Exact int32 sums per block, then f32: per block one scale product and one FMA in
          // each of 8 (or 4) lanes, then the lanes: one rounding per step, of at most 2^-24 of
          // the magnitudes summed; GELU's fast tanh, 2^-20 relative.
          const double pre = blocks_exact + bias;
          const double rounding = (2.0 * static_cast<double>(C / Weight::kElements) + 10) * 0x1.0p-24 * (sum_abs + std::fabs(bias));
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

// The products' own input quantizers (AVX-512 where built so) against the reference ones, bit for
// bit: random rows, and a block whose values are exact halves (its largest 127, so that the
// quantizers multiply by exactly 1), where Q8_0 rounds away from zero and Q8_K to even.
TEST(QuantizedRows, QuantizeAsTheReferenceQuantizersDo) {
  Rng rng(testing::test_seed());
  std::vector<float> x = to_floats(random_vector(rng, 4 * 256, 3.0));
  std::vector<float> halves = {127.0f, -126.5f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -3.5f, 0.0f, 125.5f};
  halves.resize(256, 64.5f);
  x.insert(x.end(), halves.begin(), halves.end());
  const auto count = static_cast<int64_t>(x.size());
  std::vector<BlockQ8_0> q8_0(static_cast<size_t>(count / 32)), q8_0_reference(q8_0.size());
  cpu::quantize_rows_q8_0(x.data(), q8_0.data(), count);
  quantize_q8_0(x.data(), q8_0_reference.data(), count);
  EXPECT_EQ(0, std::memcmp(q8_0.data(), q8_0_reference.data(), q8_0.size() * sizeof(BlockQ8_0)));
  EXPECT_EQ(q8_0[4 * 256 / 32].q[1], -127);  // -126.5 away from zero
  std::vector<BlockQ8_K> q8_k(static_cast<size_t>(count / 256)), q8_k_reference(q8_k.size());
  cpu::quantize_rows_q8_k(x.data(), q8_k.data(), count);
  quantize_q8_k(x.data(), q8_k_reference.data(), count);
  EXPECT_EQ(0, std::memcmp(q8_k.data(), q8_k_reference.data(), q8_k.size() * sizeof(BlockQ8_K)));
  EXPECT_EQ(q8_k[4].q[1], -126);  // -126.5 to even
}

TYPED_TEST(QuantizedMatmul, RefusesWeightsThatAreNotWholeBlocksOfOutInRows) {
  Backend& backend = cpu_backend();
  const int64_t block = dtype_block_elements(TypeParam::kType);
  Tensor weight = backend.empty({32, 2 * block}, TypeParam::kType);
  Tensor inp = backend.empty({2, 2 * block}, DType::f32), out = backend.empty({2, 32}, DType::f32);
  EXPECT_THROW(backend.launch(MatmulForward{.out = out, .inp = inp, .weight = weight, .layout = WeightLayout::in_out}),
               Error);
  EXPECT_NO_THROW(backend.launch(MatmulForward{.out = out, .inp = inp, .weight = weight, .layout = WeightLayout::out_in}));
}

}  // namespace
}  // namespace paraflow
