// A test-only backend whose memory the host may not touch: tensors it allocates refuse
// data<T>() and raw(), and are reached only through its upload/download/copy and the kernels
// (the CPU's, registered for its device kind). Op tests, a short training run and generation run
// on it, so host access to backend memory cannot creep back into ops, the trainer, gradient sync
// or the generator: a CUDA backend then only has to supply kernels and copies.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace paraflow::testing {

Backend& opaque_backend();

// Every backend present, then the opaque one: what the kernel tests run on.
std::vector<Backend*> backends_with_opaque();

}  // namespace paraflow::testing
