// The CUDA backend's entry points for the backend layer (available_backends) and the tests.
#pragma once

#include <string>

#include "backend/backend.h"

namespace paraflow::cuda {

// The backend on GPU 0 when this process sees a GPU (its kernels registered on first call), else
// null; `why_not` then says why (no driver, no device, ...).
Backend* backend_if_present(std::string* why_not = nullptr);

}  // namespace paraflow::cuda
