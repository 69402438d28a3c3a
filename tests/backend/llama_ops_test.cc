// The Llama family's kernels (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), on
// every backend present and on the opaque test backend, against the float64 references on random
// inputs of awkward sizes; the first three in bf16 and float16 too.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "backend/opaque_backend.h"
#include "backend/reference_kernels.h"
#include "test_util.h"

namespace paraflow {
namespace {

using testing::random_vector;
using Vec = std::vector<double>;

class LlamaOpsTest : public ::testing::TestWithParam<Backend*> {
 protected:
  Backend& backend() { return *GetParam(); }
  Tensor put(const Vec& values, Shape shape) {
    return backend().upload(std::vector<float>(values.begin(), values.end()), std::move(shape), DType::f32);
  }
  Vec get(const Tensor& tensor) {
    std::vector<float> values = backend().download<float>(tensor);
    return Vec(values.begin(), values.end());
  }
  Tensor zeros(Shape shape) { return backend().empty(std::move(shape), DType::f32); }
  // A gradient buffer full of NaN: a kernel told to assign must not read it.
  Tensor garbage(Shape shape) { return put(Vec(static_cast<size_t>(shape.numel()), std::nan("")), shape); }
  // 16-bit tensors (mixed precision's activations): `values` rounded to `dtype`, and back.
  Tensor put_half(const Vec& values, Shape shape, DType dtype) {
    Tensor tensor = backend().empty(shape, dtype);
    backend().launch(Cast{.src = put(values, shape), .dst = tensor});
    return tensor;
  }
  Vec get_half(const Tensor& tensor) {
    Tensor f32 = zeros(tensor.shape());
    backend().launch(Cast{.src = tensor, .dst = f32});
    return get(f32);
  }
  // Half an ulp of `dtype`, relative: a 16-bit kernel rounds each output once.
  static double half_ulp(DType dtype) { return dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048; }
  Rng rng{testing::test_seed()};
};

TEST_P(LlamaOpsTest, RmsNorm) {
  const int64_t N = 3 * 13, C = 30;
  Vec x = random_vector(rng, N * C, 2.0), w = random_vector(rng, C), dout = random_vector(rng, N * C);
  for (bool accumulate : {false, true}) {
    Vec dx_start = accumulate ? random_vector(rng, N * C) : Vec(N * C, 0.0), dw_start = random_vector(rng, C);
    Tensor out = zeros({N, C}), rstd = zeros({N}), x_t = put(x, {N, C}), w_t = put(w, {C});
    backend().launch(RmsnormForward{.out = out, .rstd = rstd, .inp = x_t, .weight = w_t, .eps = 1e-5f});
    Tensor dx = accumulate ? put(dx_start, {N, C}) : garbage({N, C}), dw = put(dw_start, {C});
    backend().launch(RmsnormBackward{.dinp = dx,
                                     .dweight = dw,
                                     .dout = put(dout, {N, C}),
                                     .inp = x_t,
                                     .weight = w_t,
                                     .rstd = rstd,
                                     .accumulate_dinp = accumulate});
    Vec ref_out, ref_dx = dx_start, ref_dw = dw_start;
    reference::rmsnorm_forward(ref_out, x, w, N, C, 1e-5);
    reference::rmsnorm_backward(ref_dx, ref_dw, dout, x, w, N, C, 1e-5);
    EXPECT_CLOSE(get(out), ref_out, C, "rmsnorm out");
    EXPECT_CLOSE(get(dx), ref_dx, C, "rmsnorm dx");
    EXPECT_CLOSE(get(dw), ref_dw, N, "rmsnorm dweight");
  }
}

// bf16 and float16 rows in and out (mixed precision's activations), the sums in f32: within the
// formats' rounding of the float64 reference on the rounded inputs.
TEST_P(LlamaOpsTest, RmsNormIn16Bits) {
  const int64_t N = 21, C = 30;
  Vec x = random_vector(rng, N * C, 2.0), w = random_vector(rng, C), dout = random_vector(rng, N * C);
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto values = [&](const Tensor& tensor) { return get_half(tensor); };
    Tensor x_t = put_half(x, {N, C}, dtype), dout_t = put_half(dout, {N, C}, dtype), w_t = put(w, {C});
    Tensor out = backend().empty({N, C}, dtype), rstd = zeros({N}), dx = backend().empty({N, C}, dtype), dw = zeros({C});
    backend().launch(RmsnormForward{.out = out, .rstd = rstd, .inp = x_t, .weight = w_t, .eps = 1e-5f});
    backend().launch(RmsnormBackward{.dinp = dx, .dweight = dw, .dout = dout_t, .inp = x_t, .weight = w_t,
                                     .rstd = rstd});
    Vec ref_out, ref_dx(N * C), ref_dw(C);
    reference::rmsnorm_forward(ref_out, values(x_t), w, N, C, 1e-5);
    reference::rmsnorm_backward(ref_dx, ref_dw, values(dout_t), values(x_t), w, N, C, 1e-5);
    const double epsilon = half_ulp(dtype);
    EXPECT_LT(testing::relative_error(values(out), ref_out), 2 * epsilon);
    EXPECT_LT(testing::relative_error(values(dx), ref_dx), 2 * epsilon);
    EXPECT_LT(testing::relative_error(get(dw), ref_dw), 1e-5);
  }
}

TEST_P(LlamaOpsTest, SwiGlu) {
  const int64_t N = 7, F = 37;
  Vec gate = random_vector(rng, N * F, 4.0), up = random_vector(rng, N * F), dout = random_vector(rng, N * F);
  Vec dup_start = random_vector(rng, N * F);
  Tensor gate_t = put(gate, {N, F}), up_t = put(up, {N, F}), out = zeros({N, F});
  backend().launch(SwigluForward{.out = out, .gate = gate_t, .up = up_t});
  // The gate's gradient assigned (over NaN), the up's added to.
  Tensor dgate = garbage({N, F}), dup = put(dup_start, {N, F});
  backend().launch(SwigluBackward{.dgate = dgate, .dup = dup, .dout = put(dout, {N, F}), .gate = gate_t, .up = up_t,
                                  .accumulate_up = true});
  Vec ref_out, ref_dgate(N * F), ref_dup = dup_start;
  reference::swiglu_forward(ref_out, gate, up);
  reference::swiglu_backward(ref_dgate, ref_dup, dout, gate, up);
  EXPECT_CLOSE(get(out), ref_out, 2, "swiglu out");
  EXPECT_CLOSE(get(dgate), ref_dgate, 2, "swiglu dgate");
  EXPECT_CLOSE(get(dup), ref_dup, 2, "swiglu dup");
}

// The rotation and the gate in bf16 and float16 (inputs, outputs and gradients, a gradient added
// to), computed in f32: within one rounding of the float64 reference on the rounded inputs.
TEST_P(LlamaOpsTest, RotaryEmbeddingsAndSwiGluIn16Bits) {
  const int64_t B = 2, T = 9, NH = 4, KVH = 2, hs = 10, W = (NH + 2 * KVH) * hs;
  const RopeFrequencies f{.theta = 500000, .scaling = RopeScaling::linear, .factor = 2};
  const std::vector<float> inverse32 = rope_inverse_frequencies(f, hs);
  const Vec inverse(inverse32.begin(), inverse32.end());
  std::vector<int64_t> positions, inverse_positions;  // backward rotates by minus the angle
  for (int64_t row = 0; row < B * T; ++row) {
    positions.push_back(row % T);
    inverse_positions.push_back(-(row % T));
  }
  Vec qkv = random_vector(rng, B * T * W), dout = random_vector(rng, B * T * W), start = random_vector(rng, B * T * W);
  Vec gate = random_vector(rng, B * T * W, 4.0), up = random_vector(rng, B * T * W);
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Shape shape{B, T, W};
    Tensor qkv_t = put_half(qkv, shape, dtype), dout_t = put_half(dout, shape, dtype);
    Tensor start_t = put_half(start, shape, dtype), out = backend().empty(shape, dtype);
    const Vec qkv_h = get_half(qkv_t), dout_h = get_half(dout_t), start_h = get_half(start_t);
    backend().launch(RopeForward{.out = out, .qkv = qkv_t, .n_head = NH, .n_kv_head = KVH, .frequencies = f});
    backend().launch(RopeBackward{.dqkv = start_t, .dout = dout_t, .n_head = NH, .n_kv_head = KVH, .frequencies = f,
                                  .accumulate_dqkv = true});
    Vec ref_out, ref_back;
    reference::rope_forward(ref_out, qkv_h, positions, inverse, NH, KVH, hs);
    reference::rope_forward(ref_back, dout_h, inverse_positions, inverse, NH, KVH, hs);
    for (size_t i = 0; i < ref_back.size(); ++i) ref_back[i] += start_h[i];
    EXPECT_LT(testing::relative_error(get_half(out), ref_out), 2 * half_ulp(dtype)) << "rope out";
    EXPECT_LT(testing::relative_error(get_half(start_t), ref_back), 2 * half_ulp(dtype)) << "rope dqkv";

    Tensor gate_t = put_half(gate, shape, dtype), up_t = put_half(up, shape, dtype);
    Tensor gated = backend().empty(shape, dtype), dgate = backend().empty(shape, dtype);
    Tensor dup = put_half(start, shape, dtype);
    backend().launch(SwigluForward{.out = gated, .gate = gate_t, .up = up_t});
    backend().launch(SwigluBackward{.dgate = dgate, .dup = dup, .dout = dout_t, .gate = gate_t, .up = up_t,
                                    .accumulate_up = true});
    Vec ref_gated, ref_dgate(qkv.size()), ref_dup = start_h;
    reference::swiglu_forward(ref_gated, get_half(gate_t), get_half(up_t));
    reference::swiglu_backward(ref_dgate, ref_dup, dout_h, get_half(gate_t), get_half(up_t));
    EXPECT_LT(testing::relative_error(get_half(gated), ref_gated), 2 * half_ulp(dtype)) << "swiglu out";
    EXPECT_LT(testing::relative_error(get_half(dgate), ref_dgate), 2 * half_ulp(dtype)) << "swiglu dgate";
    EXPECT_LT(testing::relative_error(get_half(dup), ref_dup), 2 * half_ulp(dtype)) << "swiglu dup";
  }
}

// Each scaling with its own inverse frequencies, written out here from transformers' formulas in
// float64; positions far enough out (up to ~4000) that a wrong frequency shows.
Vec expected_inverse_frequencies(const RopeFrequencies& f, int64_t hs) {
  Vec inverse;
  for (int64_t i = 0; i < hs / 2; ++i) {
    double value = 1.0 / std::pow(f.theta, 2.0 * static_cast<double>(i) / static_cast<double>(hs));
    if (f.scaling == RopeScaling::linear) value /= f.factor;
    if (f.scaling == RopeScaling::llama3) {
      const double wavelen = 2 * M_PI / value;
      if (wavelen > f.original_max_position / f.low_freq_factor) {
        value /= f.factor;
      } else if (wavelen >= f.original_max_position / f.high_freq_factor) {
        const double smooth = (f.original_max_position / wavelen - f.low_freq_factor) /
                              (f.high_freq_factor - f.low_freq_factor);
        value = (1 - smooth) * value / f.factor + smooth * value;
      }
    }
    inverse.push_back(value);
  }
  return inverse;
}

TEST_P(LlamaOpsTest, RotaryEmbeddingsWithEachScaling) {
  const int64_t B = 2, T = 5, NH = 6, KVH = 2, hs = 18, W = (NH + 2 * KVH) * hs;
  const RopeFrequencies scalings[] = {
      {.theta = 10000},
      {.theta = 500000, .scaling = RopeScaling::linear, .factor = 4},
      // Llama 3.1's values with a small original context, so that every band occurs in hs/2 = 9.
      {.theta = 500000, .scaling = RopeScaling::llama3, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
       .original_max_position = 64},
  };
  for (const RopeFrequencies& f : scalings) {
    SCOPED_TRACE(::testing::Message() << "scaling " << static_cast<int>(f.scaling));
    const Vec inverse = expected_inverse_frequencies(f, hs);
    const std::vector<float> computed = rope_inverse_frequencies(f, hs);
    ASSERT_EQ(computed.size(), inverse.size());
    EXPECT_CLOSE(Vec(computed.begin(), computed.end()), inverse, 4, "rope inverse frequencies");
    Vec qkv = random_vector(rng, B * T * W), dout = random_vector(rng, B * T * W);
    // A decoding step's first position, and a ragged batch's positions row by row.
    const int64_t position0 = 3987;
    std::vector<int32_t> ragged{0, 7, 4000, 1, 2, 3, 9, 11, 4095, 5};
    Tensor ragged_t = Tensor::zeros(Shape{B * T}, DType::i32);
    std::copy(ragged.begin(), ragged.end(), ragged_t.data<int32_t>());
    for (int run = 0; run < 3; ++run) {
      std::vector<int64_t> positions;
      for (int64_t row = 0; row < B * T; ++row) {
        positions.push_back(run == 0 ? row % T : run == 1 ? position0 + row % T : ragged[static_cast<size_t>(row)]);
      }
      Tensor out = zeros({B, T, W}), qkv_t = put(qkv, {B, T, W});
      backend().launch(RopeForward{.out = out,
                                   .qkv = qkv_t,
                                   .n_head = NH,
                                   .n_kv_head = KVH,
                                   .frequencies = f,
                                   .position0 = run == 1 ? position0 : 0,
                                   .positions = run == 2 ? ragged_t : Tensor()});
      Vec ref_out;
      reference::rope_forward(ref_out, qkv, positions, inverse, NH, KVH, hs);
      // An angle of ~4000 radians carries float32's rounding of the position times the frequency.
      EXPECT_CLOSE(get(out), ref_out, run == 0 ? 2 : 4096, "rope out");
    }
    // Backward is the transpose of the rotation: <rope(x), dy> = <x, rope^T(dy)>, and the v
    // columns pass the gradient through; added to what dqkv holds.
    Vec dqkv_start = random_vector(rng, B * T * W);
    Tensor dqkv = put(dqkv_start, {B, T, W});
    backend().launch(RopeBackward{.dqkv = dqkv,
                                  .dout = put(dout, {B, T, W}),
                                  .n_head = NH,
                                  .n_kv_head = KVH,
                                  .frequencies = f,
                                  .accumulate_dqkv = true});
    std::vector<int64_t> training_positions;
    for (int64_t row = 0; row < B * T; ++row) training_positions.push_back(row % T);
    Vec ref_dqkv = dqkv_start;
    for (size_t i = 0; i < qkv.size(); ++i) {  // column i of the (linear) rotation, dotted with dout
      Vec unit(qkv.size(), 0.0), column;
      unit[i] = 1;
      reference::rope_forward(column, unit, training_positions, inverse, NH, KVH, hs);
      for (size_t j = 0; j < column.size(); ++j) ref_dqkv[i] += column[j] * dout[j];
    }
    EXPECT_CLOSE(get(dqkv), ref_dqkv, 2, "rope dqkv");
  }
}

// Grouped-query attention: n_kv_head dividing n_head (1 = multi-query), head size not a multiple
// of 8, with and without adding into dqkv; and explicit head sizes (NH·hs unrelated to a model
// width).
TEST_P(LlamaOpsTest, GroupedQueryAttention) {
  const int64_t B = 2, T = 70;  // two causal blocks
  for (auto [NH, KVH, hs] : {std::tuple{int64_t{6}, int64_t{2}, int64_t{5}}, std::tuple{int64_t{4}, int64_t{1}, int64_t{12}},
                             std::tuple{int64_t{3}, int64_t{3}, int64_t{7}}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << NH << " KVH=" << KVH << " hs=" << hs);
    const int64_t C = NH * hs, W = (NH + 2 * KVH) * hs;
    const double scale = 1 / std::sqrt(static_cast<double>(hs));
    for (bool accumulate : {false, true}) {
      Vec qkv = random_vector(rng, B * T * W), dout = random_vector(rng, B * T * C);
      Vec dqkv_start = accumulate ? random_vector(rng, B * T * W) : Vec(B * T * W, 0.0);
      Tensor out = zeros({B, T, C}), logsumexp = zeros({B, NH, T}), qkv_t = put(qkv, {B, T, W});
      Tensor dqkv = accumulate ? put(dqkv_start, {B, T, W}) : garbage({B, T, W});
      backend().launch(AttentionForward{.out = out, .logsumexp = logsumexp, .qkv = qkv_t, .n_head = NH,
                                        .n_kv_head = KVH, .scale = static_cast<float>(scale)});
      backend().launch(AttentionBackward{.dqkv = dqkv, .dout = put(dout, {B, T, C}), .qkv = qkv_t,
                                         .logsumexp = logsumexp, .n_head = NH, .n_kv_head = KVH,
                                         .scale = static_cast<float>(scale), .accumulate_dqkv = accumulate});
      Vec ref_out, ref_dqkv = dqkv_start;
      reference::attention_forward(ref_out, qkv, B, T, C, NH, scale, KVH);
      reference::attention_backward(ref_dqkv, dout, qkv, B, T, C, NH, scale, KVH);
      EXPECT_CLOSE(get(out), ref_out, hs + T, "gqa attention out");
      EXPECT_CLOSE(get(dqkv), ref_dqkv, (hs + T) * NH / KVH, "gqa attention dqkv");
    }
  }
}

// Decoding's attention with grouped k/v heads: a contiguous cache filled in two steps, and a
// paged one (blocks in shuffled order, f32 and bf16 pools) filled by a whole prompt, each token
// then attending to its sequence so far; against the reference's causal attention.
TEST_P(LlamaOpsTest, GroupedQueryAttentionOverKvCaches) {
  const int64_t T = 11, NH = 6, KVH = 2, hs = 16, C = NH * hs, W = (NH + 2 * KVH) * hs, max_T = 16, block = 4;
  const float scale = 0.25f;
  Vec qkv = random_vector(rng, T * W), ref_out;
  reference::attention_forward(ref_out, qkv, 1, T, C, NH, scale, KVH);
  {
    Tensor k_cache = zeros({1, KVH, max_T, hs}), v_cache = zeros({1, KVH, max_T, hs}), out = zeros({1, T, C});
    Vec first(qkv.begin(), qkv.begin() + 4 * W), rest(qkv.begin() + 4 * W, qkv.end());
    Tensor out_first = zeros({1, 4, C}), out_rest = zeros({1, T - 4, C});
    backend().launch(AttentionCachedForward{.out = out_first, .qkv = put(first, {1, 4, W}), .k_cache = k_cache,
                                            .v_cache = v_cache, .n_head = NH, .n_kv_head = KVH, .scale = scale});
    backend().launch(AttentionCachedForward{.out = out_rest, .qkv = put(rest, {1, T - 4, W}), .k_cache = k_cache,
                                            .v_cache = v_cache, .n_head = NH, .n_kv_head = KVH, .scale = scale,
                                            .past = 4});
    Vec got = get(out_first), more = get(out_rest);
    got.insert(got.end(), more.begin(), more.end());
    EXPECT_CLOSE(got, ref_out, hs + T, "gqa attention over a contiguous cache");
  }
  for (DType pool_dtype : {DType::f32, DType::bf16}) {
    const int64_t blocks = 5, max_blocks = 4;
    Tensor k_pool = backend().empty({blocks, KVH, block, hs}, pool_dtype);
    Tensor v_pool = backend().empty({blocks, KVH, block, hs}, pool_dtype);
    Tensor positions = Tensor::zeros(Shape{T}, DType::i32), tables = Tensor::zeros(Shape{T, max_blocks}, DType::i32);
    const int32_t order[max_blocks] = {3, 0, 4, 1};
    for (int64_t i = 0; i < T; ++i) {
      positions.data<int32_t>()[i] = static_cast<int32_t>(i);
      std::copy(order, order + max_blocks, tables.data<int32_t>() + i * max_blocks);
    }
    Tensor out = zeros({T, 1, C});
    backend().launch(AttentionPagedForward{.out = out, .qkv = put(qkv, {T, 1, W}), .k_pool = k_pool, .v_pool = v_pool,
                                           .positions = positions, .block_tables = tables, .n_head = NH,
                                           .n_kv_head = KVH, .scale = scale});
    if (pool_dtype == DType::f32) {
      EXPECT_CLOSE(get(out), ref_out, hs + T, "gqa attention over a paged cache");
    } else {  // keys and values rounded to bf16: within bf16's rounding
      const double error = testing::relative_error(get(out), ref_out);
      std::printf("  gqa paged attention, bf16 pools rel err %.3e\n", error);
      EXPECT_LT(error, 1e-2);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, LlamaOpsTest,
                         ::testing::ValuesIn(testing::backends_with_opaque()),
                         [](const auto& info) { return info.param->name(); });

}  // namespace
}  // namespace paraflow
