// cuBLASLt's entry points, opened with dlopen when the CUDA backend is first created. Linked at
// build time, libcublasLt costs every paraflow process about 210 MiB of resident memory as it
// starts (the loader's work on a 540 MB library), GPU or not: a CPU-only run must not pay it.
#pragma once

#include <cublasLt.h>

namespace paraflow::cuda {

struct CublasLt {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// The library, opened on first call; throws paraflow::Error naming the library or the missing
// symbol when it cannot be opened.
const CublasLt& cublaslt();

}  // namespace paraflow::cuda
