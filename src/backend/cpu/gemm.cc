#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "base/error.h"
#include "tensor/tensor.h"

namespace paraflow::cpu {

namespace {

GemmEngine engine_from_environment() {
  const char* choice = std::getenv("PARAFLOW_GEMM");
  if (choice == nullptr || *choice == '\0') return GemmEngine::by_shape;
  if (std::strcmp(choice, "openblas") == 0) return GemmEngine::openblas;
  if (std::strcmp(choice, "onednn") == 0) return GemmEngine::onednn;
  if (std::strcmp(choice, "onednn_matmul") == 0) return GemmEngine::onednn_matmul;
  fail("PARAFLOW_GEMM='{}': expected 'openblas', 'onednn' or 'onednn_matmul' (unset: each product by its shape)",
       choice);
}

// Registry-like process setting, read once from the environment.
std::atomic<GemmEngine>& current_engine() {
  static std::atomic<GemmEngine> engine{engine_from_environment()};
  return engine;
}

}  // namespace

GemmEngine gemm_engine() { return current_engine().load(); }
void set_gemm_engine(GemmEngine engine) { current_engine().store(engine); }
std::string gemm_engine_name(GemmEngine engine) {
  switch (engine) {
    case GemmEngine::by_shape: return "by_shape";
    case GemmEngine::openblas: return "openblas";
    case GemmEngine::onednn: return "onednn";
    case GemmEngine::onednn_matmul: return "onednn_matmul";
  }
  return "unknown";
}

namespace {

// One oneDNN matmul: element types, transpositions, sizes, leading dimensions, a bias or not,
// and C = alpha * op(A) · op(B) + beta * C (an output scale and a sum post-op).
struct MatmulKey {
  DType ab_dtype, c_dtype;
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc;
  bool bias;
  float alpha, beta;
  auto operator<=>(const MatmulKey&) const = default;
};

// oneDNN matmul primitives are compiled per shape: each is built once and kept. Primitives may
// run concurrently (attention calls GEMMs from inside its parallel loop), so the lock covers the
// lookup only, and each thread has its own stream.
class MatmulCache {
 public:
  const std::pair<dnnl::matmul, dnnl::matmul::primitive_desc>& get(const MatmulKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = primitives_.find(key);
    if (found == primitives_.end()) found = primitives_.emplace(key, build(key)).first;
    return found->second;  // std::map nodes stay put while others are inserted
  }
  const dnnl::engine& engine() const { return engine_; }

 private:
  std::pair<dnnl::matmul, dnnl::matmul::primitive_desc> build(const MatmulKey& key) const {
    using dt = dnnl::memory::data_type;
    auto type = [](DType dtype) { return dtype == DType::bf16 ? dt::bf16 : dt::f32; };
    // A (M,K) row-major with stride lda, or, transposed, (K,M) read as (M,K); B likewise (K,N).
    dnnl::memory::desc a_md({key.M, key.K}, type(key.ab_dtype),
                            key.trans_a ? dnnl::memory::dims{1, key.lda} : dnnl::memory::dims{key.lda, 1});
    dnnl::memory::desc b_md({key.K, key.N}, type(key.ab_dtype),
                            key.trans_b ? dnnl::memory::dims{1, key.ldb} : dnnl::memory::dims{key.ldb, 1});
    dnnl::memory::desc c_md({key.M, key.N}, type(key.c_dtype), dnnl::memory::dims{key.ldc, 1});
    dnnl::primitive_attr attributes;
    // The primitive's scratch memory comes from us (run_matmul): left to oneDNN it is allocated
    // and page-faulted anew on every call, which cost a fifth of a bf16 training step.
    attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.alpha != 1.0f) attributes.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops sum;
      sum.append_sum(key.beta);
      attributes.set_post_ops(sum);
    }
    dnnl::matmul::primitive_desc pd =
        key.bias ? dnnl::matmul::primitive_desc(
                       dnnl::matmul::desc(a_md, b_md, dnnl::memory::desc({1, key.N}, dt::f32, {key.N, 1}), c_md),
                       attributes, engine_)
                 : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attributes, engine_);
    return {dnnl::matmul(pd), pd};
  }

  std::mutex mutex_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::map<MatmulKey, std::pair<dnnl::matmul, dnnl::matmul::primitive_desc>> primitives_;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

void run_matmul(const MatmulKey& key, const void* A, const void* B, const float* bias, void* C) {
  MatmulCache& cache = matmul_cache();
  const auto& [primitive, pd] = cache.get(key);
  thread_local dnnl::stream stream(cache.engine());
  dnnl::memory a(pd.src_desc(), cache.engine(), const_cast<void*>(A));
  dnnl::memory b(pd.weights_desc(), cache.engine(), const_cast<void*>(B));
  dnnl::memory c(pd.dst_desc(), cache.engine(), C);
  std::unordered_map<int, dnnl::memory> arguments{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (bias != nullptr) {
    arguments.emplace(DNNL_ARG_BIAS, dnnl::memory(pd.bias_desc(), cache.engine(), const_cast<float*>(bias)));
  }
  const size_t scratch_bytes = pd.scratchpad_desc().get_size();
  if (scratch_bytes > 0) {
    // Per thread (GEMMs may run concurrently), grown as needed and kept.
    thread_local std::shared_ptr<Storage> scratch;
    if (!scratch || scratch->bytes() < scratch_bytes) scratch = allocate_host(scratch_bytes);
    arguments.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(pd.scratchpad_desc(), cache.engine(), scratch->data()));
  }
  primitive.execute(stream, arguments);
  stream.wait();
}

bool onednn_isa_includes(dnnl::cpu_isa wanted) {
  const auto isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  return (isa & static_cast<int>(wanted)) == static_cast<int>(wanted);
}

// Whether OpenBLAS picked its AVX-512 kernels for this CPU. It picks by CPU model, and a model it
// does not know gets generic SSE3 kernels ("Prescott"): Debian's 0.3.21 does so on Emerald Rapids
// Xeons (model 207), where its sgemm ran at ~40 GFLOP/s against oneDNN's ~260.
bool openblas_runs_avx512_kernels() {
  static const bool avx512 = [] {
    const std::string core = openblas_get_corename();
    return core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
  }();
  return avx512;
}

}  // namespace

// oneDNN's sgemm reads a transposed A slowly when one side of C is narrow: a weight gradient
// (A^T · B, K the batch's rows) of gpt-small (C 384) ran at 235-330 GFLOP/s against 305-380 in
// OpenBLAS on the AMX Xeon, while at the 124M shape's 768 and up oneDNN's was the faster one
// (bench/RESULTS.md, "Float32 GEMMs by shape"; bench/train/gemm_shapes_bench). Elsewhere (forward
// products, input gradients, wider weight gradients) oneDNN was ahead or within a few percent.
// That was OpenBLAS's AVX-512 kernels. Where it runs others (it does not know the Xeon without
// AMX, model 207), oneDNN's matmul primitive takes the long narrow ones (one side at least four
// times the other): its brgemm kernels read the transposed A faster than its sgemm, 1.02-1.3x on
// gpt-small's fc, fc_proj and lm_head weight gradients, while on the squarer qkv and proj ones it
// was 0.9x and on the 124M shape's wider ones up to 3x slower (bench/RESULTS.md, "Long narrow
// weight gradients through oneDNN's matmul primitive"). Without AVX-512, where oneDNN has no
// brgemm matmul, its sgemm.
GemmEngine engine_for_shape(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
  const bool narrow_weight_gradient = trans_a && !trans_b && std::min(M, N) <= 512 && M * N * K >= (int64_t{1} << 27);
  if (!narrow_weight_gradient) return GemmEngine::onednn;
  if (openblas_runs_avx512_kernels()) return GemmEngine::openblas;
  static const bool brgemm_matmul = onednn_isa_includes(dnnl::cpu_isa::avx512_core);
  const bool long_narrow = std::max(M, N) >= 4 * std::min(M, N);
  return brgemm_matmul && long_narrow ? GemmEngine::onednn_matmul : GemmEngine::onednn;
}

std::string openblas_core_name() { return openblas_get_corename(); }

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  GemmEngine engine = gemm_engine();
  if (engine == GemmEngine::by_shape) engine = engine_for_shape(trans_a, trans_b, M, N, K);
  if (engine == GemmEngine::openblas) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
                static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
    return;
  }
  if (engine == GemmEngine::onednn_matmul && K > 0) {  // (a K of 0 only scales C: sgemm below)
    run_matmul({DType::f32, DType::f32, trans_a, trans_b, M, N, K, lda, ldb, ldc, false, alpha, beta}, A, B, nullptr, C);
    return;
  }
  dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                                    C, ldc);
  if (status != dnnl_success) {
    throw Error(fmt::format("oneDNN sgemm failed (status {}) for M={} N={} K={}", static_cast<int>(status), M, N, K));
  }
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, const float* bias, bool accumulate, void* C, DType c_dtype, int64_t ldc) {
  if (M == 0 || N == 0) return;
  run_matmul({DType::bf16, c_dtype, trans_a, trans_b, M, N, K, lda, ldb, ldc, bias != nullptr, 1.0f,
              accumulate ? 1.0f : 0.0f},
             A, B, bias, C);
}

bool has_native_bf16() { return onednn_isa_includes(dnnl::cpu_isa::avx512_core_bf16); }

bool bf16_gemms_beat_f32() {
  return onednn_isa_includes(dnnl::cpu_isa::avx512_core_amx) ||
         (__builtin_cpu_is("amd") && onednn_isa_includes(dnnl::cpu_isa::avx512_core_bf16));
}

std::string onednn_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "other (dnnl_cpu_isa " + std::to_string(static_cast<int>(dnnl::get_effective_cpu_isa())) + ")";
  }
}

}  // namespace paraflow::cpu
