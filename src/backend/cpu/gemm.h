// GEMMs on the CPU, row-major. Single precision: C = alpha * op(A) · op(B) + beta * C through one
// of three engines from Debian's OpenBLAS and oneDNN: OpenBLAS's sgemm, oneDNN's sgemm, or oneDNN's
// matmul primitive (compiled per shape; its brgemm kernels on AVX-512). By default each product
// takes the one its shape calls for (gemm.cc; bench/train/gemm_shapes_bench times each on a model's
// training GEMMs), and PARAFLOW_GEMM=openblas|onednn|onednn_matmul puts every product on one of
// them. bfloat16: oneDNN's matmul primitive, on AMX or AVX512_BF16.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace paraflow::cpu {

enum class GemmEngine { by_shape, openblas, onednn, onednn_matmul };

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The engine an f32 product takes by its shape (GemmEngine::by_shape): openblas, onednn or
// onednn_matmul. The same shape always takes the same engine, so results are reproducible bit for
// bit.
GemmEngine engine_for_shape(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);
// The kernels OpenBLAS chose for this CPU, e.g. "SkylakeX" (or "Prescott": generic SSE3).
std::string openblas_core_name();

// C (M,N) (+)= op(A) · op(B) [+ bias (N) f32], A and B bf16, f32 accumulation, C f32 or bf16
// (c_dtype). With accumulate the product is added to C (rounded once, in C's type).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, const float* bias, bool accumulate, void* C, DType c_dtype, int64_t ldc);

// Whether the CPU multiplies bf16 natively (AVX512_BF16 or AMX).
bool has_native_bf16();
// Whether bf16 GEMMs beat f32 ones: with AMX, or with AVX512_BF16 on an AMD CPU (Zen 4 and
// later issue vdpbf16ps, two multiply-adds a lane, as fast as f32 FMAs). AVX512_BF16 alone is not
// enough: an Intel Xeon without AMX (Emerald Rapids, AMX hidden by its VM) issues its dot
// products at half the rate of f32 FMAs, and oneDNN's bf16 GEMMs ran at half its sgemm's speed
// there (bench/RESULTS.md). A fixed rule, not a timing: every process of a job must take the
// same path.
bool bf16_gemms_beat_f32();
// The instruction set oneDNN dispatches to on this CPU, e.g. "avx512_core_amx".
std::string onednn_isa_name();

GemmEngine gemm_engine();
void set_gemm_engine(GemmEngine engine);
std::string gemm_engine_name(GemmEngine engine);

}  // namespace paraflow::cpu
