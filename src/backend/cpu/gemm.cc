#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

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

}  // namespace paraflow::cpu
