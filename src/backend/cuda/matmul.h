// The matmul kernels on CUDA: GEMMs through cuBLASLt (f32 or bf16 operands, f32 accumulation, the
// bias of an f32 output in cuBLASLt's epilogue), the bias of a bf16 output, GELU and its gradient in
// kernels of ours (elementwise.cu).
#pragma once

#include "backend/kernel_args.h"

namespace paraflow::cuda {

void matmul_forward(const MatmulForward& args);
void matmul_backward(const MatmulBackward& args);

}  // namespace paraflow::cuda
