#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "base/error.h"

namespace paraflow::cpu {

namespace {

GemmEngine engine_from_environment() {
  const char* choice = std::getenv("PARAFLOW_GEMM");
  if (choice == nullptr || *choice == '\0') return GemmEngine::onednn;  // measured faster: bench/RESULTS.md
  if (std::strcmp(choice, "openblas") == 0) return GemmEngine::openblas;
  if (std::strcmp(choice, "onednn") == 0) return GemmEngine::onednn;
  fail("PARAFLOW_GEMM='{}': expected 'openblas' or 'onednn'", choice);
}

// Registry-like process setting, read once from the environment.
std::atomic<GemmEngine>& current_engine() {
  static std::atomic<GemmEngine> engine{engine_from_environment()};
  return engine;
}

}  // namespace

GemmEngine gemm_engine() { return current_engine().load(); }
void set_gemm_engine(GemmEngine engine) { current_engine().store(engine); }
std::string gemm_engine_name(GemmEngine engine) { return engine == GemmEngine::openblas ? "openblas" : "onednn"; }

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (gemm_engine() == GemmEngine::openblas) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
                static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
    return;
  }
  dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                                    C, ldc);
  if (status != dnnl_success) {
    throw Error(fmt::format("oneDNN sgemm failed (status {}) for M={} N={} K={}", static_cast<int>(status), M, N, K));
  }
}

namespace {

// oneDNN matmul primitives are compiled per shape: build each once and keep it.
struct BiasGemmCache {
  using Key = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  std::mutex mutex;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::pair<dnnl::matmul, dnnl::matmul::primitive_desc>> primitives;
};

BiasGemmCache& bias_gemm_cache() {
  static BiasGemmCache cache;
  return cache;
}

}  // namespace

bool sgemm_bias(bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                int64_t ldb, const float* bias, float* C, int64_t ldc) {
  if (gemm_engine() != GemmEngine::onednn) return false;
  using dt = dnnl::memory::data_type;
  BiasGemmCache& cache = bias_gemm_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  BiasGemmCache::Key key{trans_b, M, N, K, lda, ldb, ldc};
  auto found = cache.primitives.find(key);
  if (found == cache.primitives.end()) {
    dnnl::memory::desc a_md({M, K}, dt::f32, dnnl::memory::dims{lda, 1});
    // B is (K,N): row-major with stride ldb, or, transposed, (N,K) row-major read as (K,N).
    dnnl::memory::desc b_md({K, N}, dt::f32, trans_b ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
    dnnl::memory::desc bias_md({1, N}, dt::f32, dnnl::memory::dims{N, 1});
    dnnl::memory::desc c_md({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), cache.engine);
    found = cache.primitives.emplace(key, std::make_pair(dnnl::matmul(pd), pd)).first;
  }
  const auto& [primitive, pd] = found->second;
  dnnl::memory a(pd.src_desc(), cache.engine, const_cast<float*>(A));
  dnnl::memory b(pd.weights_desc(), cache.engine, const_cast<float*>(B));
  dnnl::memory bias_memory(pd.bias_desc(), cache.engine, const_cast<float*>(bias));
  dnnl::memory c(pd.dst_desc(), cache.engine, C);
  primitive.execute(cache.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_BIAS, bias_memory},
                                   {DNNL_ARG_DST, c}});
  cache.stream.wait();
  return true;
}

}  // namespace paraflow::cpu
