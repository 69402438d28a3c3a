#include "backend/cuda/matmul.h"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "base/error.h"

namespace paraflow::cuda {

namespace {

cudaDataType_t cuda_type(DType dtype, const char* operand) {
  if (dtype == DType::f32) return CUDA_R_32F;
  if (dtype == DType::bf16) return CUDA_R_16BF;
  throw Error(fmt::format("cuda matmul: {} is {}; the GEMMs take f32 or bf16", operand, dtype_name(dtype)));
}

Element element_of(DType dtype, const char* operand) {
  return cuda_type(dtype, operand) == CUDA_R_16BF ? Element::bf16 : Element::f32;
}

// C [M,N] (+)= op(A) [M,K] · op(B) [K,N] (+ bias over N), all row-major; op transposes a matrix
// stored the other way round ([K,M] for A, [N,K] for B).
struct Gemm {
  int64_t M, N, K;
  const void* a;
  bool transpose_a;
  const void* b;
  bool transpose_b;
  void* c;
  DType operand_type, c_type;
  const float* bias = nullptr;
  bool accumulate = false;
};

// The largest power of two up to 256 that divides the address.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// cuBLASLt is column-major: a row-major [r,c] matrix is its column-major [c,r] transpose, so
// row-major C = op(A)·op(B) is column-major C^T = op(B)^T·op(A)^T: B's buffer goes first, and the
// bias (one value per row of the column-major result) runs over C's columns, as wanted.
void run(const Gemm& g) {
  const cudaDataType_t operand = cuda_type(g.operand_type, "an operand"), result = cuda_type(g.c_type, "the output");
  cublasLtMatmulDesc_t desc = nullptr;
  check_cublas(cublaslt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  try {
    const cublasOperation_t op_first = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_cublas(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "TRANSA");
    check_cublas(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), "TRANSB");
    if (g.bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_32F;
      check_cublas(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "epilogue");
      check_cublas(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)), "bias");
      check_cublas(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
                   "bias type");
    }
    // Stored (pre-op) column-major shapes: B's buffer is [N,K] as op'd, A's [K,M].
    const uint64_t first_rows = g.transpose_b ? g.K : g.N, first_cols = g.transpose_b ? g.N : g.K;
    const uint64_t second_rows = g.transpose_a ? g.M : g.K, second_cols = g.transpose_a ? g.K : g.M;
    check_cublas(cublaslt().MatrixLayoutCreate(&first, operand, first_rows, first_cols, first_rows), "layout B");
    check_cublas(cublaslt().MatrixLayoutCreate(&second, operand, second_rows, second_cols, second_rows), "layout A");
    check_cublas(cublaslt().MatrixLayoutCreate(&out, result, g.N, g.M, g.N), "layout C");
    check_cublas(cublaslt().MatmulPreferenceCreate(&preference), "preference");
    const size_t workspace = kGemmWorkspaceBytes;
    check_cublas(cublaslt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof(workspace)),
                 "workspace size");
    // cuBLASLt assumes 256-byte aligned matrices unless told otherwise; the memory planner places
    // tensors at 64-byte boundaries in its arena.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> matrices[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.b}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c}};
    for (const auto& [attribute, pointer] : matrices) {
      const uint32_t alignment = alignment_of(pointer);
      check_cublas(cublaslt().MatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)),
                   "alignment");
    }
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    check_cublas(cublaslt().MatmulAlgoGetHeuristic(blas_handle(), desc, first, second, out, out, preference, 1, &heuristic,
                                                &found),
                 "algorithm heuristic");
    if (found == 0) {
      throw Error(fmt::format("cuBLASLt has no algorithm for a {}x{}x{} {} GEMM into {}", g.M, g.N, g.K,
                              dtype_name(g.operand_type), dtype_name(g.c_type)));
    }
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    check_cublas(cublaslt().Matmul(blas_handle(), desc, &alpha, g.b, first, g.a, second, &beta, g.c, out, g.c, out,
                                &heuristic.algo, gemm_workspace(), kGemmWorkspaceBytes, stream()),
                 "matmul");
  } catch (...) {
    cublaslt().MatmulPreferenceDestroy(preference);
    cublaslt().MatrixLayoutDestroy(out);
    cublaslt().MatrixLayoutDestroy(second);
    cublaslt().MatrixLayoutDestroy(first);
    cublaslt().MatmulDescDestroy(desc);
    throw;
  }
  cublaslt().MatmulPreferenceDestroy(preference);
  cublaslt().MatrixLayoutDestroy(out);
  cublaslt().MatrixLayoutDestroy(second);
  cublaslt().MatrixLayoutDestroy(first);
  cublaslt().MatmulDescDestroy(desc);
}

struct Dims {
  int64_t N, C, OC;
  bool transposed;  // weight [OC,C] (out_in) rather than [C,OC]
};

template <typename Args>
Dims dims_of(const Args& args, const Tensor& output) {
  check(args.layout == WeightLayout::in_out || args.layout == WeightLayout::out_in,
        "cuda matmul: {} weights are the CPU's decoding layouts", weight_layout_name(args.layout));
  const int64_t C = args.inp.shape()[args.inp.shape().rank() - 1];
  return {args.inp.numel() / C, C, output.shape()[output.shape().rank() - 1], args.layout == WeightLayout::out_in};
}

}  // namespace

void matmul_forward(const MatmulForward& args) {
  const Dims d = dims_of(args, args.out);
  check(args.weight.dtype() == args.inp.dtype(), "cuda matmul: {} rows times a {} weight", dtype_name(args.inp.dtype()),
        dtype_name(args.weight.dtype()));
  const float* bias = args.bias.defined() ? args.bias.device_data<float>() : nullptr;
  // out (N,OC) = inp (N,C) · W (+ bias). An f32 out takes the bias in cuBLASLt's epilogue (whose
  // bias has D's type) and GELU in place; a bf16 out with a bias or GELU is summed into an f32
  // scratch and rounded once, after both, as the CPU's.
  const bool f32_out = args.out.dtype() == DType::f32;
  const bool finish = args.gelu || (!f32_out && bias != nullptr);
  std::optional<Scratch> sums;
  if (finish && !f32_out) sums.emplace(sizeof(float) * static_cast<size_t>(d.N * d.OC));
  void* product = sums ? sums->as<void>() : args.out.device_address();
  run({.M = d.N, .N = d.OC, .K = d.C, .a = args.inp.device_address(), .transpose_a = false,
       .b = args.weight.device_address(), .transpose_b = d.transposed, .c = product,
       .operand_type = args.inp.dtype(), .c_type = sums ? DType::f32 : args.out.dtype(),
       .bias = f32_out ? bias : nullptr});
  if (finish) {
    finish_product(static_cast<const float*>(product), f32_out ? nullptr : bias, args.gelu,
                   element_of(args.out.dtype(), "out"), args.out.device_address(),
                   args.gelu && args.gelu_slope.defined() ? args.gelu_slope.device_address() : nullptr, d.N, d.OC);
  }
}

void matmul_backward(const MatmulBackward& args) {
  const Dims d = dims_of(args, args.dout);
  check(!args.gelu || args.gelu_slope.defined(),
        "matmul backward with GELU: no gelu_slope (its forward pass kept none, as for decoding)");
  const DType operands = args.inp.dtype();
  // The GEMMs' dout operand has the operands' type: an f32 dout is used (and, with GELU,
  // overwritten) in place, as the CPU's; bf16 operands with an f32 dout or GELU take a bf16 copy,
  // made in the pass that applies GELU's derivative and sums the bias gradient.
  const bool in_place = args.dout.dtype() == operands && (operands == DType::f32 || !args.gelu);
  std::optional<Scratch> copy;
  void* grad = args.dout.device_address();
  if (!in_place) {
    copy.emplace(dtype_bytes(operands, d.N * d.OC));
    grad = copy->as<void>();
  }
  if (args.gelu || !in_place || args.dbias.defined()) {
    output_gradient(element_of(args.dout.dtype(), "dout"), args.dout.device_address(),
                    args.gelu ? args.gelu_slope.device_address() : nullptr, element_of(operands, "inp"), grad,
                    args.dbias.defined() ? args.dbias.device_data<float>() : nullptr, d.N, d.OC);
  }
  if (args.dinp.defined()) {
    // dinp (N,C) (+)= dout (N,OC) · W^T
    run({.M = d.N, .N = d.C, .K = d.OC, .a = grad, .transpose_a = false, .b = args.weight.device_address(),
         .transpose_b = !d.transposed, .c = args.dinp.device_address(), .operand_type = operands,
         .c_type = args.dinp.dtype(), .accumulate = args.accumulate_dinp});
  }
  if (!args.dweight.defined()) return;  // a weight that takes no gradient
  if (d.transposed) {
    // dW [OC,C] (+)= dout^T · inp
    run({.M = d.OC, .N = d.C, .K = d.N, .a = grad, .transpose_a = true, .b = args.inp.device_address(),
         .transpose_b = false, .c = args.dweight.device_address(), .operand_type = operands,
         .c_type = args.dweight.dtype(), .accumulate = args.accumulate_dweight});
  } else {
    // dW [C,OC] (+)= inp^T · dout
    run({.M = d.C, .N = d.OC, .K = d.N, .a = args.inp.device_address(), .transpose_a = true, .b = grad,
         .transpose_b = false, .c = args.dweight.device_address(), .operand_type = operands,
         .c_type = args.dweight.dtype(), .accumulate = args.accumulate_dweight});
  }
}

}  // namespace paraflow::cuda
