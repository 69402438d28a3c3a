#include "backend/backend.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string_view>

#ifdef PARAFLOW_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace paraflow {

const char* kernel_op_name(KernelOp op) {
#define PARAFLOW_KERNEL_CASE(name) \
  case KernelOp::name: return #name;
  switch (op) { PARAFLOW_KERNELS(PARAFLOW_KERNEL_CASE) }
#undef PARAFLOW_KERNEL_CASE
  return "?";
}

bool is_backward_kernel(KernelOp op) { return std::string_view(kernel_op_name(op)).ends_with("_backward"); }

const char* weight_layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::in_out: return "in_out";
    case WeightLayout::out_in: return "out_in";
    case WeightLayout::out_in_interleaved: return "out_in_interleaved";
    case WeightLayout::out_in_tiles: return "out_in_tiles";
  }
  return "?";
}

WeightLayout Backend::decoding_layout(DType dtype, int64_t columns) const {
  if (prefers_interleaved_weights(dtype)) return WeightLayout::out_in_interleaved;
  // AMX multiplies whole 16 x 32 tiles; the half products read a group's columns in pairs, the
  // quantized tile products whole blocks.
  const int64_t whole_tile_columns = dtype == DType::f16 ? 2 : is_block_quantized(dtype) ? dtype_block_elements(dtype) : 32;
  if (prefers_tiled_weights(dtype) && columns % whole_tile_columns == 0) return WeightLayout::out_in_tiles;
  return WeightLayout::out_in;
}

namespace {

// Written while backends register (once each, under the mutex), read without it afterwards:
// std::map lookups do not race with each other, and registration finishes before the first
// launch of the backend that registered.
struct KernelTable {
  std::mutex mutex;
  std::map<KernelKey, ErasedKernel> kernels;
};

KernelTable& kernel_table() {
  static KernelTable table;
  return table;
}

}  // namespace

KernelRegistry& kernel_registry() {
  static KernelRegistry registry;
  return registry;
}

void KernelRegistry::add_erased(const KernelKey& key, ErasedKernel kernel) {
  KernelTable& table = kernel_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.kernels[key] = std::move(kernel);
}

const ErasedKernel* KernelRegistry::find(const KernelKey& key) const {
  const KernelTable& table = kernel_table();
  auto found = table.kernels.find(key);
  return found == table.kernels.end() ? nullptr : &found->second;
}

const ErasedKernel* Backend::kernel(KernelOp op, DType dtype) const {
  const ErasedKernel* found = kernel_registry().find({op, device().kind, dtype});
  if (found == nullptr) {
    throw Error(fmt::format("backend '{}' has no {} kernel for {} on {}", name(), kernel_op_name(op),
                            dtype_name(dtype), device().to_string()));
  }
  return found;
}

void Backend::check_host_copy(const Tensor& tensor, size_t count, size_t element_size) {
  if (count != static_cast<size_t>(tensor.numel()) || element_size != dtype_block_bytes(tensor.dtype()) ||
      is_block_quantized(tensor.dtype())) {
    throw Error(fmt::format("host copy of {} elements of {} bytes for a {} {} tensor", count, element_size,
                            dtype_name(tensor.dtype()), tensor.shape().to_string()));
  }
}

std::vector<Backend*> available_backends() {
  std::vector<Backend*> backends{&cpu_backend()};
#ifdef PARAFLOW_CUDA
  if (Backend* gpu = cuda::backend_if_present()) backends.push_back(gpu);
#endif
  return backends;
}

Backend& default_backend() {
#ifdef PARAFLOW_CUDA
  std::string why_not;
  if (Backend* gpu = cuda::backend_if_present(&why_not)) return *gpu;
  static std::once_flag said;
  std::call_once(said, [&] { fmt::print(stderr, "no GPU ({}): using the CPU\n", why_not); });
#endif
  return cpu_backend();
}

}  // namespace paraflow
