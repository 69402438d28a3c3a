// The CUDA runtime state the backend's host code shares: its stream (kernels.h), the cuBLASLt
// handle and workspace, and the error check every CUDA call goes through.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace paraflow::cuda {

// Throws paraflow::Error naming `what` and CUDA's message unless status is cudaSuccess.
void check_cuda(cudaError_t status, const char* what);
void check_cublas(cublasStatus_t status, const char* what);

cublasLtHandle_t blas_handle();
// cuBLASLt's workspace: one buffer, reused by every GEMM (they run in order on the one stream).
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
void* gemm_workspace();

}  // namespace paraflow::cuda
