// The float64 references' backward passes against central finite differences of their forward
// passes, so the op tests compare with something independently checked.
#include <gtest/gtest.h>

#include <functional>

#include "backend/reference_kernels.h"
#include "test_util.h"

namespace paraflow {
namespace {

using Vec = std::vector<double>;

// Checks d/dx of sum(forward(x) * dout) against `analytic`, for every element of x.
void check_gradient(Vec& x, const std::function<Vec()>& forward, const Vec& dout, const Vec& analytic,
                    const char* what) {
  const double h = 1e-5;
  Vec numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    Vec plus = forward();
    x[i] = saved - h;
    Vec minus = forward();
    x[i] = saved;
    double sum = 0;
    for (size_t j = 0; j < plus.size(); ++j) sum += (plus[j] - minus[j]) * dout[j];
    numeric[i] = sum / (2 * h);
  }
  double error = testing::relative_error(analytic, numeric);
  std::printf("  %-24s finite-difference rel err %.2e\n", what, error);
  EXPECT_LT(error, 1e-7) << what;  // O(h^2) truncation plus O(u/h) rounding for h = 1e-5
}

TEST(ReferenceKernels, BackwardMatchesFiniteDifferences) {
  Rng rng(testing::test_seed());
  const int64_t B = 2, T = 3, C = 4, NH = 2, V = 5, N = B * T, OC = 6;
  std::vector<int32_t> tokens{1, 4, 0, 2, 2, 3};

  {  // layernorm: x, weight, bias
    Vec x = testing::random_vector(rng, N * C), w = testing::random_vector(rng, C), b = testing::random_vector(rng, C);
    Vec dout = testing::random_vector(rng, N * C), dx(N * C), dw(C), db(C);
    reference::layernorm_backward(dx, dw, db, dout, x, w, N, C, 1e-5);
    auto forward = [&] { Vec out; reference::layernorm_forward(out, x, w, b, N, C, 1e-5); return out; };
    check_gradient(x, forward, dout, dx, "layernorm dx");
    check_gradient(w, forward, dout, dw, "layernorm dweight");
    check_gradient(b, forward, dout, db, "layernorm dbias");
  }
  for (bool transposed : {false, true}) {  // matmul with bias and GELU
    Vec x = testing::random_vector(rng, N * C), w = testing::random_vector(rng, C * OC), b = testing::random_vector(rng, OC);
    Vec dout = testing::random_vector(rng, N * OC), dx(N * C), dw(C * OC), db(OC);
    reference::matmul_backward(dx, dw, &db, dout, x, w, &b, N, C, OC, transposed, true);
    auto forward = [&] { Vec out; reference::matmul_forward(out, x, w, &b, N, C, OC, transposed, true); return out; };
    check_gradient(x, forward, dout, dx, "matmul+gelu dx");
    check_gradient(w, forward, dout, dw, "matmul+gelu dweight");
    check_gradient(b, forward, dout, db, "matmul+gelu dbias");
  }
  for (double scale : {1 / std::sqrt(static_cast<double>(C / NH)), 0.3}) {  // attention: GPT-2's scale and another
    Vec qkv = testing::random_vector(rng, B * T * 3 * C), dout = testing::random_vector(rng, B * T * C);
    Vec dqkv(B * T * 3 * C);
    reference::attention_backward(dqkv, dout, qkv, B, T, C, NH, scale);
    auto forward = [&] { Vec out; reference::attention_forward(out, qkv, B, T, C, NH, scale); return out; };
    check_gradient(qkv, forward, dout, dqkv, scale == 0.3 ? "attention dqkv, scale 0.3" : "attention dqkv");
  }
  {  // grouped-query attention: 4 q heads on 2 k/v heads of 3
    const int64_t QH = 4, KVH = 2, hs = 3, W = (QH + 2 * KVH) * hs;
    Vec qkv = testing::random_vector(rng, B * T * W), dout = testing::random_vector(rng, B * T * QH * hs);
    Vec dqkv(B * T * W);
    reference::attention_backward(dqkv, dout, qkv, B, T, QH * hs, QH, 0.4, KVH);
    auto forward = [&] { Vec out; reference::attention_forward(out, qkv, B, T, QH * hs, QH, 0.4, KVH); return out; };
    check_gradient(qkv, forward, dout, dqkv, "gqa attention dqkv");
  }
  {  // rmsnorm: x, weight
    Vec x = testing::random_vector(rng, N * C), w = testing::random_vector(rng, C);
    Vec dout = testing::random_vector(rng, N * C), dx(N * C), dw(C);
    reference::rmsnorm_backward(dx, dw, dout, x, w, N, C, 1e-5);
    auto forward = [&] { Vec out; reference::rmsnorm_forward(out, x, w, N, C, 1e-5); return out; };
    check_gradient(x, forward, dout, dx, "rmsnorm dx");
    check_gradient(w, forward, dout, dw, "rmsnorm dweight");
  }
  {  // swiglu: gate, up
    Vec gate = testing::random_vector(rng, N * C), up = testing::random_vector(rng, N * C);
    Vec dout = testing::random_vector(rng, N * C), dgate(N * C), dup(N * C);
    reference::swiglu_backward(dgate, dup, dout, gate, up);
    auto forward = [&] { Vec out; reference::swiglu_forward(out, gate, up); return out; };
    check_gradient(gate, forward, dout, dgate, "swiglu dgate");
    check_gradient(up, forward, dout, dup, "swiglu dup");
  }
  {  // softmax cross-entropy
    Vec logits = testing::random_vector(rng, N * V), dlosses = testing::random_vector(rng, N), dlogits(N * V);
    std::vector<int32_t> targets{0, 4, -1, 2, 1, 3};
    reference::softmax_xent_backward(dlogits, logits, targets, dlosses, N, V);
    auto forward = [&] { Vec out; reference::softmax_xent_forward(out, logits, targets, N, V); return out; };
    check_gradient(logits, forward, dlosses, dlogits, "softmax_xent dlogits");
  }
  {  // embedding
    Vec wte = testing::random_vector(rng, V * C), wpe = testing::random_vector(rng, T * C);
    Vec dout = testing::random_vector(rng, N * C), dwte(V * C), dwpe(T * C);
    reference::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    auto forward = [&] { Vec out; reference::embedding_forward(out, tokens, wte, wpe, B, T, C); return out; };
    check_gradient(wte, forward, dout, dwte, "embedding dwte");
    check_gradient(wpe, forward, dout, dwpe, "embedding dwpe");
  }
}

}  // namespace
}  // namespace paraflow
