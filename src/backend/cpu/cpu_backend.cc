#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "base/error.h"

namespace paraflow {

namespace {

// Forwards each Backend kernel to the free functions in backend/cpu/.
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device{}; }

  Tensor empty(Shape shape, DType dtype) override { return Tensor::zeros(std::move(shape), dtype); }
  void copy(const Tensor& from, const Tensor& to) override {
    if (from.nbytes() != to.nbytes()) {
      throw Error(fmt::format("copy of {} bytes into a {}-byte tensor", from.nbytes(), to.nbytes()));
    }
    std::memcpy(to.raw(), from.raw(), from.nbytes());
  }
  void fill_zero(const Tensor& tensor) override { std::memset(tensor.raw(), 0, tensor.nbytes()); }
  void synchronize() override {}

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                         int64_t C, int64_t position0) override {
    cpu::embedding_forward(out, tokens, wte, wpe, B, T, C, position0);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                          int64_t C) override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* weight, const float* bias,
                         int64_t N, int64_t C, float eps, DType dtype) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, dtype);
  }
  void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                          bool accumulate_dinp, DType dtype) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, accumulate_dinp, dtype);
  }
  void matmul_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int64_t N,
                      int64_t C, int64_t OC, WeightLayout layout, bool gelu) override {
    cpu::matmul_forward(out, pre, inp, weight, bias, N, C, OC, layout, gelu);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, float* dout, const float* inp, const float* weight,
                       const float* pre, int64_t N, int64_t C, int64_t OC, WeightLayout layout, bool gelu,
                       bool accumulate_dinp) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, pre, N, C, OC, layout, gelu, accumulate_dinp);
  }
  void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                         float scale) override {
    cpu::attention_forward(out, probs, qkv, B, T, C, NH, scale);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int64_t B, int64_t T,
                          int64_t C, int64_t NH, float scale, bool accumulate_dqkv) override {
    cpu::attention_backward(dqkv, dout, qkv, probs, B, T, C, NH, scale, accumulate_dqkv);
  }
  void attention_cached_forward(float* out, const float* qkv, float* k_cache, float* v_cache, int64_t B, int64_t Tn,
                                int64_t C, int64_t NH, float scale, int64_t past, int64_t max_T) override {
    cpu::attention_cached_forward(out, qkv, k_cache, v_cache, B, Tn, C, NH, scale, past, max_T);
  }
  void add_forward(void* out, const void* a, const void* b, int64_t n, DType dtype) override {
    cpu::add_forward(out, a, b, n, dtype);
  }
  void add_backward(void* da, void* db, const void* dout, int64_t n, bool accumulate_a, bool accumulate_b,
                    DType dtype) override {
    cpu::add_backward(da, db, dout, n, accumulate_a, accumulate_b, dtype);
  }
  void softmax_xent_forward(float* losses, float* stats, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V) override {
    cpu::softmax_xent_forward(losses, stats, logits, targets, N, V);
  }
  void softmax_xent_backward(float* dlogits, const float* logits, const float* stats, const int32_t* targets,
                             const float* dlosses, int64_t N, int64_t V, bool accumulate) override {
    cpu::softmax_xent_backward(dlogits, logits, stats, targets, dlosses, N, V, accumulate);
  }
  void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, bool accumulate) override {
    cpu::cast(src, src_dtype, dst, dst_dtype, n, accumulate);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
  void scale(float* x, float factor, int64_t n) override { cpu::scale(x, factor, n); }
  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                    const AdamWParams& params) override {
    cpu::adamw_update(param, grad, m, v, n, params);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

std::vector<Backend*> available_backends() { return {&cpu_backend()}; }

}  // namespace paraflow
