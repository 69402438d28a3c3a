#include "backend/opaque_backend.h"

#include <cstdlib>
#include <cstring>

namespace paraflow::testing {

namespace {

class OpaqueBackend final : public Backend {
 public:
  OpaqueBackend() { cpu_backend(); }  // registers the CPU kernels this backend runs

  std::string name() const override { return "opaque"; }
  Device device() const override { return Device{}; }

  Tensor empty(Shape shape, DType dtype) override {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    const size_t rounded = (bytes + 63) / 64 * 64 + 64;
    void* data = std::aligned_alloc(64, rounded);
    if (data == nullptr) throw Error("opaque backend: out of memory");
    std::memset(data, 0, rounded);
    auto storage = std::make_shared<Storage>(data, bytes, device(), false, [](void* pointer) { std::free(pointer); });
    return Tensor(std::move(storage), 0, std::move(shape), dtype);
  }
  void upload(const void* host, const Tensor& to) override { std::memcpy(to.device_address(), host, to.nbytes()); }
  void download(const Tensor& from, void* host) override { std::memcpy(host, from.device_address(), from.nbytes()); }
  void copy(const Tensor& from, const Tensor& to) override {
    check(from.nbytes() == to.nbytes(), "opaque backend: copy of {} bytes into {}", from.nbytes(), to.nbytes());
    std::memcpy(to.device_address(), from.device_address(), from.nbytes());
  }
  void fill_zero(const Tensor& tensor) override { std::memset(tensor.device_address(), 0, tensor.nbytes()); }
  void synchronize() override {}
  // The CPU's kernels, so the CPU's weight layouts.
  bool prefers_interleaved_weights(DType dtype) const override {
    return cpu_backend().prefers_interleaved_weights(dtype);
  }
  bool prefers_tiled_weights(DType dtype) const override { return cpu_backend().prefers_tiled_weights(dtype); }
};

}  // namespace

Backend& opaque_backend() {
  static OpaqueBackend backend;
  return backend;
}

std::vector<Backend*> backends_with_opaque() {
  std::vector<Backend*> backends = available_backends();
  backends.push_back(&opaque_backend());
  return backends;
}

}  // namespace paraflow::testing
