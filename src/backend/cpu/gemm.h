// Single-precision GEMM on the CPU, row-major: C = alpha * op(A) · op(B) + beta * C.
// Two engines from Debian are linked, OpenBLAS and oneDNN; bench/gemm_engines measures both on
// our shapes and the faster is the default. PARAFLOW_GEMM=openblas|onednn picks one at run time.
#pragma once

#include <cstdint>
#include <string>

namespace paraflow::cpu {

enum class GemmEngine { openblas, onednn };

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C (M,N) = A (M,K) · op(B) + bias (N, broadcast over rows), row-major, with the bias added
// inside the GEMM's own write-back (oneDNN's matmul primitive) instead of a second pass over C.
// Returns false when the engine cannot (OpenBLAS): the caller then adds the bias itself.
bool sgemm_bias(bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                int64_t ldb, const float* bias, float* C, int64_t ldc);

GemmEngine gemm_engine();
void set_gemm_engine(GemmEngine engine);
std::string gemm_engine_name(GemmEngine engine);

}  // namespace paraflow::cpu
