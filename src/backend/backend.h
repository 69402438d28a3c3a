// The Backend: a device's memory (allocation and the copies in and out of it) and the kernels
// registered for that device. Kernels are keyed by (kernel, device kind, dtype), as TensorFlow's
// REGISTER_KERNEL_BUILDER(Name(..).Device(..).TypeConstraint<T>(..)) keys them: a bf16 GEMM or
// another device comes in one kernel at a time, and supports() tells a graph pass whether it
// may hand an op 16-bit inputs. A missing kernel fails naming kernel, device and dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/kernel_args.h"
#include "base/error.h"
#include "tensor/tensor.h"

namespace paraflow {

struct KernelKey {
  KernelOp op;
  DeviceKind device;
  DType dtype;
  auto operator<=>(const KernelKey&) const = default;
};

// A kernel with its argument struct's type erased (the registry holds every kernel kind).
using ErasedKernel = std::function<void(const void* args)>;

// The process-wide kernel table. Backends register their kernels once, when first created.
class KernelRegistry {
 public:
  template <typename Args>
  void add(DeviceKind device, DType dtype, void (*kernel)(const Args&)) {
    add_erased({Args::op, device, dtype}, [kernel](const void* args) { kernel(*static_cast<const Args*>(args)); });
  }
  // Null when no kernel is registered under key.
  const ErasedKernel* find(const KernelKey& key) const;

 private:
  void add_erased(const KernelKey& key, ErasedKernel kernel);
};
KernelRegistry& kernel_registry();

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // The name and what runs the kernels, e.g. "cpu (oneDNN ISA avx512_core_amx)".
  virtual std::string describe() const { return name(); }

  // ---- memory ----
  virtual Tensor empty(Shape shape, DType dtype) = 0;  // zero-filled, in this backend's memory
  // Copies tensor.nbytes() bytes between host memory and a tensor of this backend.
  virtual void upload(const void* host, const Tensor& to) = 0;
  virtual void download(const Tensor& from, void* host) = 0;
  virtual void copy(const Tensor& from, const Tensor& to) = 0;  // same byte count, both on this backend
  virtual void fill_zero(const Tensor& tensor) = 0;
  virtual void synchronize() = 0;

  // Host vectors in and out, the element type checked against the tensor's dtype.
  template <typename T>
  Tensor upload(const std::vector<T>& values, Shape shape, DType dtype) {
    Tensor tensor = empty(std::move(shape), dtype);
    check_host_copy(tensor, values.size(), sizeof(T));
    upload(values.data(), tensor);
    return tensor;
  }
  template <typename T>
  std::vector<T> download(const Tensor& tensor) {
    std::vector<T> values(static_cast<size_t>(tensor.numel()));
    check_host_copy(tensor, values.size(), sizeof(T));
    download(tensor, values.data());
    return values;
  }

  // `tensor` itself when the host can read it, else a host copy of it.
  Tensor on_host(const Tensor& tensor) {
    if (tensor.host_accessible()) return tensor;
    Tensor copy = Tensor::zeros(tensor.shape(), tensor.dtype());
    download(tensor, copy.raw());
    return copy;
  }

  // ---- kernels ----
  bool supports(KernelOp op, DType dtype) const {
    return kernel_registry().find({op, device().kind, dtype}) != nullptr;
  }
  // Whether the device does bf16 arithmetic in hardware, so that bf16 weights are decoded without
  // emulation: generate's and serve's --dtype auto picks bfloat16 there (cli::weights_dtype).
  virtual bool multiplies_bf16_natively() const { return false; }
  // Whether decoding's f32 rows times float16 weights run in half arithmetic (the CPU's
  // half_products, AVX512_FP16) rather than widened to f32.
  virtual bool multiplies_f16_natively() const { return false; }
  // Whether decoding should store `dtype` weights out_in_interleaved: true where matmul_forward
  // reads that layout and it is faster at every row count. Decoding's layout pass asks; a backend
  // that never reads it keeps false. True also commits embedding_forward to read an interleaved
  // table (EmbeddingForward::wte_interleaved), as the pass then interleaves the tied head's wte.
  virtual bool prefers_interleaved_weights(DType dtype) const {
    (void)dtype;
    return false;
  }
  // Whether decoding should store `dtype` matmul weights out_in_tiles (those that only matmuls
  // read, with whole tiles: columns a multiple of 32 in bf16, of 2 in float16, whole blocks in the
  // block-quantized types): true where matmul_forward runs that layout (AMX tiles or AVX512_BF16
  // pair products for bf16, half products for float16, AVX512_VNNI's tile products for Q8_0, Q5_0
  // and Q4_K).
  virtual bool prefers_tiled_weights(DType dtype) const {
    (void)dtype;
    return false;
  }
  // The layout decoding stores a matmul's [out, in] `dtype` weight of `columns` input features
  // in, by the two preferences above (interleaving first, as decoding's layout passes apply them).
  WeightLayout decoding_layout(DType dtype, int64_t columns) const;
  template <typename Args>
  void launch(const Args& args) {
    (*kernel(Args::op, args.dtype()))(&args);
  }

 private:
  const ErasedKernel* kernel(KernelOp op, DType dtype) const;
  static void check_host_copy(const Tensor& tensor, size_t count, size_t element_size);
};

// The CPU backend always exists; CUDA is listed after it when built with nvcc and a GPU is present.
Backend& cpu_backend();
std::vector<Backend*> available_backends();
// What training runs on: the GPU where one is present, else the CPU. A build with the CUDA backend
// says once, on stderr, that it found no GPU and uses the CPU.
Backend& default_backend();

}  // namespace paraflow
