#include "backend/cuda/cublaslt_library.h"

#include <dlfcn.h>
#include <cublas_api.h>
#include <fmt/format.h>

#include <string>

#include "base/error.h"

namespace paraflow::cuda {
namespace {

// The soname of the toolkit the backend was compiled against (its major version).
const std::string kLibrary = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);

template <typename Function>
void resolve(void* library, const char* symbol, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  check(function != nullptr, "{}: no symbol {}", kLibrary, symbol);
}

CublasLt open_library() {
  void* library = dlopen(kLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);
  check(library != nullptr, "cannot open {} (the CUDA backend's GEMMs): {}", kLibrary, dlerror());
  CublasLt lt;
  resolve(library, "cublasLtCreate", lt.Create);
  resolve(library, "cublasLtMatmul", lt.Matmul);
  resolve(library, "cublasLtMatmulAlgoGetHeuristic", lt.MatmulAlgoGetHeuristic);
  resolve(library, "cublasLtMatmulDescCreate", lt.MatmulDescCreate);
  resolve(library, "cublasLtMatmulDescDestroy", lt.MatmulDescDestroy);
  resolve(library, "cublasLtMatmulDescSetAttribute", lt.MatmulDescSetAttribute);
  resolve(library, "cublasLtMatmulPreferenceCreate", lt.MatmulPreferenceCreate);
  resolve(library, "cublasLtMatmulPreferenceDestroy", lt.MatmulPreferenceDestroy);
  resolve(library, "cublasLtMatmulPreferenceSetAttribute", lt.MatmulPreferenceSetAttribute);
  resolve(library, "cublasLtMatrixLayoutCreate", lt.MatrixLayoutCreate);
  resolve(library, "cublasLtMatrixLayoutDestroy", lt.MatrixLayoutDestroy);
  return lt;  // the library stays open for the process's life
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt library = open_library();
  return library;
}

}  // namespace paraflow::cuda
