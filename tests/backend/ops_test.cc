// Every op kernel, on every backend present, against the float64 references on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "backend/backend.h"
#include "backend/reference_kernels.h"
#include "test_util.h"

namespace paraflow {
namespace {

using testing::random_vector;
using testing::to_tensor;
using testing::to_vector;
using Vec = std::vector<double>;

// Awkward sizes on purpose: nothing a multiple of 8, a sequence that is not a power of two.
struct Dims {
  int64_t B = 3, T = 13, C = 30, NH = 3, V = 47;
};

class OpsTest : public ::testing::TestWithParam<Backend*> {
 protected:
  Backend& backend() { return *GetParam(); }
  // A gradient buffer full of NaN: a kernel told to assign must not read it.
  static Tensor garbage(Shape shape) {
    Tensor tensor = Tensor::zeros(std::move(shape));
    std::fill(tensor.data<float>(), tensor.data<float>() + tensor.numel(), std::nanf(""));
    return tensor;
  }
  Rng rng{testing::test_seed()};
  Dims d;
};

TEST_P(OpsTest, Embedding) {
  std::vector<int32_t> tokens(d.B * d.T);
  for (auto& token : tokens) token = static_cast<int32_t>(rng.below(d.V));
  Vec wte = random_vector(rng, d.V * d.C), wpe = random_vector(rng, d.T * d.C), dout = random_vector(rng, d.B * d.T * d.C);
  Tensor tokens_tensor = Tensor::zeros({d.B, d.T}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), tokens_tensor.data<int32_t>());
  Tensor out = Tensor::zeros({d.B, d.T, d.C}), dwte = Tensor::zeros({d.V, d.C}), dwpe = Tensor::zeros({d.T, d.C});
  Tensor wte_t = to_tensor(wte, {d.V, d.C}), wpe_t = to_tensor(wpe, {d.T, d.C});
  backend().embedding_forward(out.data<float>(), tokens_tensor.data<int32_t>(), wte_t.data<float>(), wpe_t.data<float>(),
                              d.B, d.T, d.C, 0);
  Tensor dout_t = to_tensor(dout, {d.B * d.T, d.C});
  backend().embedding_backward(dwte.data<float>(), dwpe.data<float>(), dout_t.data<float>(), tokens_tensor.data<int32_t>(),
                               d.B, d.T, d.C);
  Vec ref_out, ref_dwte(d.V * d.C), ref_dwpe(d.T * d.C);
  reference::embedding_forward(ref_out, tokens, wte, wpe, d.B, d.T, d.C);
  reference::embedding_backward(ref_dwte, ref_dwpe, dout, tokens, d.B, d.T, d.C);
  EXPECT_CLOSE(to_vector(out), ref_out, 2, "embedding out");
  EXPECT_CLOSE(to_vector(dwte), ref_dwte, d.B * d.T, "embedding dwte");
  EXPECT_CLOSE(to_vector(dwpe), ref_dwpe, d.B, "embedding dwpe");
}

TEST_P(OpsTest, LayerNorm) {
  int64_t N = d.B * d.T, C = d.C;
  Vec x = random_vector(rng, N * C, 2.0), w = random_vector(rng, C), b = random_vector(rng, C);
  Vec dout = random_vector(rng, N * C);
  for (double& value : x) value += 0.5;  // a non-zero mean
  Tensor out = Tensor::zeros({N, C}), mean = Tensor::zeros({N}), rstd = Tensor::zeros({N});
  Tensor x_t = to_tensor(x, {N, C}), w_t = to_tensor(w, {C}), b_t = to_tensor(b, {C}), dout_t = to_tensor(dout, {N, C});
  backend().layernorm_forward(out.data<float>(), mean.data<float>(), rstd.data<float>(), x_t.data<float>(),
                              w_t.data<float>(), b_t.data<float>(), N, C, 1e-5f, DType::f32);
  Tensor dx = garbage({N, C}), dw = Tensor::zeros({C}), db = Tensor::zeros({C});
  backend().layernorm_backward(dx.data<float>(), dw.data<float>(), db.data<float>(), dout_t.data<float>(),
                               x_t.data<float>(), w_t.data<float>(), mean.data<float>(), rstd.data<float>(), N, C,
                               false, DType::f32);
  Vec ref_out, ref_dx(N * C), ref_dw(C), ref_db(C);
  reference::layernorm_forward(ref_out, x, w, b, N, C, 1e-5);
  reference::layernorm_backward(ref_dx, ref_dw, ref_db, dout, x, w, N, C, 1e-5);
  EXPECT_CLOSE(to_vector(out), ref_out, C, "layernorm out");
  EXPECT_CLOSE(to_vector(dx), ref_dx, C, "layernorm dx");
  EXPECT_CLOSE(to_vector(dw), ref_dw, N, "layernorm dweight");
  EXPECT_CLOSE(to_vector(db), ref_db, N, "layernorm dbias");
}

struct MatmulCase {
  bool transposed, gelu, bias;
};

TEST_P(OpsTest, Matmul) {
  int64_t N = d.B * d.T, C = d.C, OC = 3 * d.C + 1;
  for (MatmulCase mc : {MatmulCase{false, false, true}, MatmulCase{false, true, true}, MatmulCase{true, false, false}}) {
    SCOPED_TRACE(::testing::Message() << "transposed=" << mc.transposed << " gelu=" << mc.gelu);
    Vec x = random_vector(rng, N * C), w = random_vector(rng, C * OC, 0.2), b = random_vector(rng, OC);
    Vec dout = random_vector(rng, N * OC);
    Tensor x_t = to_tensor(x, {N, C}), w_t = to_tensor(w, {C * OC}), b_t = to_tensor(b, {OC});
    Tensor dout_t = to_tensor(dout, {N, OC});
    Tensor out = Tensor::zeros({N, OC}), pre = Tensor::zeros({N, OC});
    WeightLayout layout = mc.transposed ? WeightLayout::out_in : WeightLayout::in_out;
    backend().matmul_forward(out.data<float>(), pre.data<float>(), x_t.data<float>(), w_t.data<float>(),
                             mc.bias ? b_t.data<float>() : nullptr, N, C, OC, layout, mc.gelu);
    // dx accumulates onto a non-zero start in one case and is assigned over garbage in the others.
    Vec dx_start = mc.transposed ? random_vector(rng, N * C) : Vec(N * C, 0.0);
    Tensor dx = mc.transposed ? to_tensor(dx_start, {N, C}) : garbage({N, C});
    Tensor dw = Tensor::zeros({C * OC}), db = Tensor::zeros({OC});
    backend().matmul_backward(dx.data<float>(), dw.data<float>(), mc.bias ? db.data<float>() : nullptr,
                              dout_t.data<float>(), x_t.data<float>(), w_t.data<float>(), pre.data<float>(), N, C, OC,
                              layout, mc.gelu, mc.transposed);
    Vec ref_out, ref_dx = dx_start, ref_dw(C * OC), ref_db(OC);
    reference::matmul_forward(ref_out, x, w, mc.bias ? &b : nullptr, N, C, OC, mc.transposed, mc.gelu);
    reference::matmul_backward(ref_dx, ref_dw, &ref_db, dout, x, w, mc.bias ? &b : nullptr, N, C, OC, mc.transposed,
                               mc.gelu);
    EXPECT_CLOSE(to_vector(out), ref_out, C, "matmul out");
    EXPECT_CLOSE(to_vector(dx), ref_dx, OC, "matmul dx");
    EXPECT_CLOSE(to_vector(dw), ref_dw, N, "matmul dweight");
    if (mc.bias) EXPECT_CLOSE(to_vector(db), ref_db, N, "matmul dbias");
  }
}

// GPT-2's score scale, 1/sqrt(head size).
double gpt2_scale(int64_t C, int64_t NH) { return 1 / std::sqrt(static_cast<double>(C / NH)); }

TEST_P(OpsTest, Attention) {
  // GPT-2's scale with one head and with several; then Hugging Face's scale_attn_weights false
  // (scale 1) and scale_attn_by_inverse_layer_idx in layer 2 (GPT-2's scale / 3).
  const double gpt2 = gpt2_scale(d.C, d.NH);
  for (auto [NH, scale] : {std::pair{int64_t{1}, gpt2_scale(d.C, 1)}, std::pair{d.NH, gpt2}, std::pair{d.NH, 1.0},
                           std::pair{d.NH, gpt2 / 3}}) {
    SCOPED_TRACE(::testing::Message() << "n_head=" << NH << " scale=" << scale);
    Vec qkv = random_vector(rng, d.B * d.T * 3 * d.C), dout = random_vector(rng, d.B * d.T * d.C);
    Tensor qkv_t = to_tensor(qkv, {d.B, d.T, 3 * d.C}), dout_t = to_tensor(dout, {d.B, d.T, d.C});
    Tensor out = Tensor::zeros({d.B, d.T, d.C}), probs = Tensor::zeros({d.B, NH, d.T, d.T});
    const bool accumulate = NH == 1;
    Vec dqkv_start = accumulate ? random_vector(rng, d.B * d.T * 3 * d.C) : Vec(d.B * d.T * 3 * d.C, 0.0);
    Tensor dqkv = accumulate ? to_tensor(dqkv_start, {d.B, d.T, 3 * d.C}) : garbage({d.B, d.T, 3 * d.C});
    backend().attention_forward(out.data<float>(), probs.data<float>(), qkv_t.data<float>(), d.B, d.T, d.C, NH,
                                static_cast<float>(scale));
    backend().attention_backward(dqkv.data<float>(), dout_t.data<float>(), qkv_t.data<float>(), probs.data<float>(),
                                 d.B, d.T, d.C, NH, static_cast<float>(scale), accumulate);
    Vec ref_out, ref_dqkv = dqkv_start;
    reference::attention_forward(ref_out, qkv, d.B, d.T, d.C, NH, scale);
    reference::attention_backward(ref_dqkv, dout, qkv, d.B, d.T, d.C, NH, scale);
    EXPECT_CLOSE(to_vector(out), ref_out, d.C / NH + d.T, "attention out");
    EXPECT_CLOSE(to_vector(dqkv), ref_dqkv, d.C / NH + d.T, "attention dqkv");
  }
}

TEST_P(OpsTest, AttentionOverSeveralCausalBlocks) {
  // T = 150 spans three of the CPU kernel's 64-row blocks (the last one partial).
  const int64_t B = 2, T = 150, C = 24, NH = 2;
  for (bool accumulate : {false, true}) {
    Vec qkv = random_vector(rng, B * T * 3 * C), dout = random_vector(rng, B * T * C);
    Vec dqkv_start = accumulate ? random_vector(rng, B * T * 3 * C) : Vec(B * T * 3 * C, 0.0);
    Tensor qkv_t = to_tensor(qkv, {B, T, 3 * C}), dout_t = to_tensor(dout, {B, T, C});
    Tensor out = Tensor::zeros({B, T, C}), probs = garbage({B, NH, T, T});
    Tensor dqkv = accumulate ? to_tensor(dqkv_start, {B, T, 3 * C}) : garbage({B, T, 3 * C});
    const double scale = gpt2_scale(C, NH);
    backend().attention_forward(out.data<float>(), probs.data<float>(), qkv_t.data<float>(), B, T, C, NH,
                                static_cast<float>(scale));
    backend().attention_backward(dqkv.data<float>(), dout_t.data<float>(), qkv_t.data<float>(), probs.data<float>(), B,
                                 T, C, NH, static_cast<float>(scale), accumulate);
    Vec ref_out, ref_dqkv = dqkv_start;
    reference::attention_forward(ref_out, qkv, B, T, C, NH, scale);
    reference::attention_backward(ref_dqkv, dout, qkv, B, T, C, NH, scale);
    EXPECT_CLOSE(to_vector(out), ref_out, C / NH + T, "attention out, 3 blocks");
    EXPECT_CLOSE(to_vector(dqkv), ref_dqkv, C / NH + T, "attention dqkv, 3 blocks");
  }
}

TEST_P(OpsTest, Residual) {
  int64_t n = d.B * d.T * d.C;
  Vec a = random_vector(rng, n), b = random_vector(rng, n), dout = random_vector(rng, n);
  Tensor a_t = to_tensor(a, {n}), b_t = to_tensor(b, {n}), dout_t = to_tensor(dout, {n}), out = Tensor::zeros({n});
  backend().add_forward(out.data<float>(), a_t.data<float>(), b_t.data<float>(), n, DType::f32);
  Tensor da = to_tensor(a, {n}), db = garbage({n});  // da accumulates onto a; db is assigned
  backend().add_backward(da.data<float>(), db.data<float>(), dout_t.data<float>(), n, true, false, DType::f32);
  Vec ref_out(n), ref_da(n);
  for (int64_t i = 0; i < n; ++i) {
    ref_out[i] = a[i] + b[i];
    ref_da[i] = a[i] + dout[i];
  }
  EXPECT_CLOSE(to_vector(out), ref_out, 2, "add out");
  EXPECT_CLOSE(to_vector(da), ref_da, 2, "add da (accumulated)");
  EXPECT_CLOSE(to_vector(db), dout, 1, "add db");
}

TEST_P(OpsTest, SoftmaxCrossEntropy) {
  int64_t N = d.B * d.T, V = d.V;
  Vec logits = random_vector(rng, N * V, 3.0), dlosses = random_vector(rng, N);
  std::vector<int32_t> targets(N);
  for (auto& target : targets) target = static_cast<int32_t>(rng.below(V));
  targets[1] = -1;  // ignored position
  Tensor logits_t = to_tensor(logits, {N, V}), dlosses_t = to_tensor(dlosses, {N});
  Tensor targets_t = Tensor::zeros({N}, DType::i32);
  std::copy(targets.begin(), targets.end(), targets_t.data<int32_t>());
  Tensor losses = Tensor::zeros({N}), stats = Tensor::zeros({N, 2}), dlogits = garbage({N, V});
  backend().softmax_xent_forward(losses.data<float>(), stats.data<float>(), logits_t.data<float>(),
                                 targets_t.data<int32_t>(), N, V);
  backend().softmax_xent_backward(dlogits.data<float>(), logits_t.data<float>(), stats.data<float>(),
                                  targets_t.data<int32_t>(), dlosses_t.data<float>(), N, V, false);
  Vec ref_losses, ref_dlogits(N * V);
  reference::softmax_xent_forward(ref_losses, logits, targets, N, V);
  reference::softmax_xent_backward(ref_dlogits, logits, targets, dlosses, N, V);
  EXPECT_CLOSE(to_vector(losses), ref_losses, V, "softmax_xent losses");
  EXPECT_CLOSE(to_vector(dlogits), ref_dlogits, V, "softmax_xent dlogits");
  EXPECT_EQ(losses.data<float>()[1], 0.0f);
  // Accumulating adds the same contribution again.
  backend().softmax_xent_backward(dlogits.data<float>(), logits_t.data<float>(), stats.data<float>(),
                                  targets_t.data<int32_t>(), dlosses_t.data<float>(), N, V, true);
  for (double& value : ref_dlogits) value *= 2;
  EXPECT_CLOSE(to_vector(dlogits), ref_dlogits, V, "softmax_xent dlogits (accumulated)");
}

// The 16-bit paths of the ops that read and write 16-bit activations directly (the
// mixed-precision policies' storage): inputs rounded to the format, the float64 reference
// computed on those rounded inputs, so what remains is the kernel's own error: its output
// rounding (u = eps/2) and f32 arithmetic. Bound: 2 eps, norm-wise.
TEST_P(OpsTest, LayerNormAndResidualIn16Bits) {
  for (auto [dtype, epsilon] : {std::pair{DType::bf16, 0x1.0p-7}, std::pair{DType::f16, 0x1.0p-10}}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto to_half = [&](const Vec& values) {
      Tensor f32 = to_tensor(values, {static_cast<int64_t>(values.size())});
      Tensor half = Tensor::zeros({static_cast<int64_t>(values.size())}, dtype);
      backend().cast(f32.raw(), DType::f32, half.raw(), dtype, f32.numel(), false);
      return half;
    };
    auto to_vec = [&](const Tensor& half) {
      Tensor f32 = Tensor::zeros({half.numel()});
      backend().cast(half.raw(), dtype, f32.raw(), DType::f32, half.numel(), false);
      return to_vector(f32);
    };
    const int64_t N = d.B * d.T, C = d.C;
    Tensor x = to_half(random_vector(rng, N * C, 2.0)), dy = to_half(random_vector(rng, N * C));
    Vec w = random_vector(rng, C), b = random_vector(rng, C);
    Tensor w_t = to_tensor(w, {C}), b_t = to_tensor(b, {C});
    Tensor out = Tensor::zeros({N * C}, dtype), dx = Tensor::zeros({N * C}, dtype);
    Tensor mean = Tensor::zeros({N}), rstd = Tensor::zeros({N}), dw = Tensor::zeros({C}), db = Tensor::zeros({C});
    backend().layernorm_forward(out.raw(), mean.data<float>(), rstd.data<float>(), x.raw(), w_t.data<float>(),
                                b_t.data<float>(), N, C, 1e-5f, dtype);
    backend().layernorm_backward(dx.raw(), dw.data<float>(), db.data<float>(), dy.raw(), x.raw(), w_t.data<float>(),
                                 mean.data<float>(), rstd.data<float>(), N, C, false, dtype);
    Vec ref_out, ref_dx(N * C), ref_dw(C), ref_db(C);
    reference::layernorm_forward(ref_out, to_vec(x), w, b, N, C, 1e-5);
    reference::layernorm_backward(ref_dx, ref_dw, ref_db, to_vec(dy), to_vec(x), w, N, C, 1e-5);
    auto check = [&](const Vec& actual, const Vec& expected, const char* what) {
      double error = testing::relative_error(actual, expected);
      std::printf("  %-5s %-24s rel err %.3e (bound %.3e)\n", dtype_name(dtype), what, error, 2 * epsilon);
      EXPECT_LE(error, 2 * epsilon) << what;
    };
    check(to_vec(out), ref_out, "layernorm out");
    check(to_vec(dx), ref_dx, "layernorm dx");
    check(to_vector(dw), ref_dw, "layernorm dweight");

    Tensor a = to_half(random_vector(rng, N * C)), c = to_half(random_vector(rng, N * C));
    Tensor sum = Tensor::zeros({N * C}, dtype), da = Tensor::zeros({N * C}, dtype), dc = to_half(Vec(N * C, 0.5));
    backend().add_forward(sum.raw(), a.raw(), c.raw(), N * C, dtype);
    backend().add_backward(da.raw(), dc.raw(), dy.raw(), N * C, false, true, dtype);
    Vec ref_sum(N * C), ref_dc(N * C), av = to_vec(a), cv = to_vec(c), dyv = to_vec(dy);
    for (int64_t i = 0; i < N * C; ++i) {
      ref_sum[i] = av[i] + cv[i];
      ref_dc[i] = 0.5 + dyv[i];
    }
    check(to_vec(sum), ref_sum, "add out");
    check(to_vec(da), dyv, "add da (assigned)");
    check(to_vec(dc), ref_dc, "add db (accumulated)");
  }
}

TEST_P(OpsTest, AdamWMatchesClosedForm) {
  // One step from m = v = 0: the update is lr·g/(|g|+eps·...) exactly, a hand-checkable value.
  const int64_t n = 5;
  Tensor param = to_tensor({1.0, -2.0, 0.5, 3.0, 0.0}, {n}), grad = to_tensor({0.1, -0.2, 0.0, 4.0, -1e-3}, {n});
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  AdamWParams p{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  backend().adamw_update(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), n, p);
  Vec expected(n), got = to_vector(param);
  Vec p0 = {1.0, -2.0, 0.5, 3.0, 0.0}, g = {0.1, -0.2, 0.0, 4.0, -1e-3};
  for (int64_t i = 0; i < n; ++i) {
    double mhat = g[i], vhat = g[i] * g[i];  // bias correction undoes the (1-beta) factors at step 1
    expected[i] = p0[i] * (1 - 0.01 * 0.1) - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
  }
  EXPECT_CLOSE(got, expected, 4, "adamw step 1");
}

TEST_P(OpsTest, SumSquaresIsExactInDouble) {
  const int64_t n = 100003;
  Vec x = random_vector(rng, n);
  Tensor x_t = to_tensor(x, {n});
  double expected = 0;
  for (int64_t i = 0; i < n; ++i) expected += static_cast<double>(x_t.data<float>()[i]) * x_t.data<float>()[i];
  EXPECT_NEAR(backend().sum_squares(x_t.data<float>(), n), expected, expected * 1e-12);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsTest, ::testing::ValuesIn(available_backends()),
                         [](const auto& info) { return info.param->name(); });

}  // namespace
}  // namespace paraflow
