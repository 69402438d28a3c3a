// The CUDA backend: GPU 0's memory (from the caching pool), copies on one stream, and the kernels
// kernel_adaptors.cc registers. Never run on a GPU so far (docs/cuda.md): the machines it was
// written on have the toolkit and no device.
#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <mutex>

#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "base/error.h"

namespace paraflow::cuda {

void register_cuda_kernels(KernelRegistry& registry);  // kernel_adaptors.cc

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(fmt::format("CUDA: {}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status)));
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("cuBLASLt: {}: status {}", what, static_cast<int>(status)));
  }
}

void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

namespace {

struct Runtime {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t blas = nullptr;
  void* workspace = nullptr;
  Runtime() {
    check_cuda(cudaSetDevice(0), "cudaSetDevice(0)");
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cublas(cublaslt().Create(&blas), "cublasLtCreate");
    workspace = device_pool().allocate(kGemmWorkspaceBytes);
  }
};

Runtime& runtime() {
  static Runtime* state = new Runtime;  // lives as long as the pool's blocks (never destroyed)
  return *state;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    runtime();
    register_cuda_kernels(kernel_registry());
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
    description_ = fmt::format("cuda ({}, sm_{}{}, {:.0f} GiB)", properties.name, properties.major, properties.minor,
                               static_cast<double>(properties.totalGlobalMem) / (1 << 30));
  }

  std::string name() const override { return "cuda"; }
  std::string describe() const override { return description_; }
  Device device() const override { return Device{DeviceKind::cuda, 0}; }

  Tensor empty(Shape shape, DType dtype) override {
    const size_t bytes = dtype_bytes(dtype, shape.numel());
    void* data = device_pool().allocate(bytes);
    check_cuda(cudaMemsetAsync(data, 0, bytes, stream()), "zero-filling a new tensor");
    auto storage = std::make_shared<Storage>(data, bytes, device(), false,
                                             [](void* block) { device_pool().release(block); });
    return Tensor(std::move(storage), 0, std::move(shape), dtype);
  }
  // Host memory may be pageable and freed when these return: the copies finish before they do.
  void upload(const void* host, const Tensor& to) override {
    check_cuda(cudaMemcpyAsync(to.device_address(), host, to.nbytes(), cudaMemcpyHostToDevice, stream()), "upload");
    synchronize();
  }
  void download(const Tensor& from, void* host) override {
    check_cuda(cudaMemcpyAsync(host, from.device_address(), from.nbytes(), cudaMemcpyDeviceToHost, stream()),
               "download");
    synchronize();
  }
  void copy(const Tensor& from, const Tensor& to) override {
    check(from.nbytes() == to.nbytes(), "cuda backend: copy of {} bytes into a {}-byte tensor", from.nbytes(),
          to.nbytes());
    check_cuda(cudaMemcpyAsync(to.device_address(), from.device_address(), from.nbytes(), cudaMemcpyDeviceToDevice,
                               stream()),
               "device copy");
  }
  void fill_zero(const Tensor& tensor) override {
    check_cuda(cudaMemsetAsync(tensor.device_address(), 0, tensor.nbytes(), stream()), "fill_zero");
  }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream()), "synchronize"); }
  // sm_80 and sm_90 multiply bf16 in their tensor cores.
  bool multiplies_bf16_natively() const override { return true; }

 private:
  std::string description_;
};

}  // namespace

cudaStream_t stream() { return runtime().stream; }
cublasLtHandle_t blas_handle() { return runtime().blas; }
void* gemm_workspace() { return runtime().workspace; }

Backend* backend_if_present(std::string* why_not) {
  static std::once_flag probed;
  static std::string absence;
  static int devices = 0;
  std::call_once(probed, [] {
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess) {
      absence = fmt::format("{} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
      devices = 0;
      cudaGetLastError();  // clear the sticky error for later calls
    } else if (devices == 0) {
      absence = "cudaGetDeviceCount() found no device";
    }
  });
  if (devices == 0) {
    if (why_not != nullptr) *why_not = absence;
    return nullptr;
  }
  static CudaBackend backend;
  return &backend;
}

}  // namespace paraflow::cuda
