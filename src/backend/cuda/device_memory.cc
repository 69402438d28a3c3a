#include "backend/cuda/device_memory.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/runtime.h"

namespace paraflow::cuda {

// 512-byte steps up to 1 MiB, 2 MiB steps beyond: a tensor whose size varies a little from step to
// step (none should) still finds its block, and at most a 2 MiB tail is wasted per large block.
size_t DevicePool::size_class(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20;
  if (bytes == 0) bytes = 1;
  return bytes <= (size_t{1} << 20) ? (bytes + kSmall - 1) / kSmall * kSmall : (bytes + kLarge - 1) / kLarge * kLarge;
}

void* DevicePool::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = free_.find(size); found != free_.end()) {
    void* block = found->second;
    free_.erase(found);
    sizes_[block] = size;
    return block;
  }
  void* block = nullptr;
  check_cuda(cudaMalloc(&block, size), "cudaMalloc of a device block");
  sizes_[block] = size;
  return block;
}

void DevicePool::release(void* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = sizes_.find(block);
  if (found == sizes_.end()) return;  // not ours: nothing to give back
  free_.emplace(found->second, block);
  sizes_.erase(found);
}

DevicePool& device_pool() {
  static DevicePool* pool = new DevicePool;  // deliberately never destroyed (see the header)
  return *pool;
}

}  // namespace paraflow::cuda
