#include "tensor/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace paraflow {

int64_t Shape::numel() const {
  int64_t count = 1;
  for (int64_t dim : dims_) count *= dim;
  return count;
}

std::string Shape::to_string() const {
  std::string text = "[";
  for (size_t i = 0; i < dims_.size(); ++i) text += (i ? ", " : "") + std::to_string(dims_[i]);
  return text + "]";
}

std::string Device::to_string() const {
  return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index);
}

std::shared_ptr<Storage> allocate_host(size_t bytes) {
  // Large buffers (weights, the activation arena) sit on 2 MiB transparent huge pages where the
  // kernel allows them: streaming the weights once per decoded token is ~1.5x faster without
  // the 4 KiB pages' TLB misses (bench/infer/bandwidth_bench --huge-pages false shows the gap).
  constexpr size_t kHugePage = size_t{2} << 20;
  // From 64 MiB they are mapped anew, zero until written, so a page costs memory only once it is
  // written: a ZeRO rank's whole-size gradient or parameter buffer, of which it writes its shard
  // and the buckets in flight, never becomes resident whole (zero-filling it here made GPT-2
  // Large's ZeRO-3 ranks hold both whole at start-up: 5.9 GiB against plan's 4.1). Smaller ones
  // are zero-filled at once, as `paraflow plan` counts every buffer a rank allocates as resident.
  constexpr size_t kMappedAnew = size_t{64} << 20;
  if (bytes >= kMappedAnew) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage, mapped = rounded + kHugePage;
    void* region = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) throw Error(fmt::format("out of host memory allocating {} bytes", bytes));
    // Trimmed to a 2 MiB-aligned run of `rounded` bytes.
    const auto begin = reinterpret_cast<uintptr_t>(region);
    const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > begin) munmap(region, aligned - begin);
    if (begin + mapped > aligned + rounded) munmap(reinterpret_cast<void*>(aligned + rounded), begin + mapped - aligned - rounded);
    void* data = reinterpret_cast<void*>(aligned);
    madvise(data, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
    return std::make_shared<Storage>(data, bytes, Device{}, true, [rounded](void* pointer) { munmap(pointer, rounded); });
  }
  const size_t alignment = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = std::max<size_t>((bytes + alignment - 1) / alignment * alignment, alignment);
  void* data = std::aligned_alloc(alignment, rounded);
  if (!data) throw Error(fmt::format("out of host memory allocating {} bytes", bytes));
  if (alignment == kHugePage) madvise(data, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
  std::memset(data, 0, rounded);
  return std::make_shared<Storage>(data, bytes, Device{}, true, [](void* pointer) { std::free(pointer); });
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)), dtype_(dtype) {
  if (offset_ + nbytes() > storage_->bytes()) {
    throw Error(fmt::format("tensor view {} {} at byte {} exceeds its {}-byte storage", dtype_name(dtype_),
                            shape_.to_string(), offset_, storage_->bytes()));
  }
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  size_t bytes = dtype_bytes(dtype, shape.numel());
  return Tensor(allocate_host(bytes), 0, std::move(shape), dtype);
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape.numel() != numel()) {
    throw Error(fmt::format("cannot reshape {} into {}", shape_.to_string(), shape.to_string()));
  }
  return Tensor(storage_, offset_, std::move(shape), dtype_);
}

Tensor Tensor::slice_flat(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > numel()) {
    throw Error(fmt::format("slice [{}, {}) out of range for {} elements", begin, begin + count, numel()));
  }
  return Tensor(storage_, offset_ + dtype_bytes(dtype_, begin), Shape{count}, dtype_);
}

Tensor Tensor::view(size_t byte_offset, Shape shape, DType dtype) const {
  return Tensor(storage_, offset_ + byte_offset, std::move(shape), dtype);
}

void Tensor::check_element_type(size_t element_size) const {
  if (element_size != dtype_block_bytes(dtype_)) {
    throw Error(fmt::format("tensor of {} accessed with a {}-byte element type", dtype_name(dtype_), element_size));
  }
}

void Tensor::check_host_access() const {
  if (!storage_->host_accessible()) {
    throw Error(fmt::format("host access to a {} {} tensor in {} memory the host cannot read: copy it with the "
                            "backend's download/upload",
                            dtype_name(dtype_), shape_.to_string(), storage_->device().to_string()));
  }
}

}  // namespace paraflow
