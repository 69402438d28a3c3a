// Device memory for the CUDA backend: a caching pool, so that the step loop allocates nothing.
// cudaMalloc is called only when no freed block of the size class is left: the first step's
// tensors and scratch buffers come from the driver, every later step's from the pool (the planner
// already places a step's activations in one arena tensor; the pool keeps that arena, the
// parameters and the kernels' scratch across steps). Blocks are reused in stream order: every
// kernel and copy of the backend runs on its one stream, so a block freed after a kernel was
// queued is written by the next user only after that kernel ran.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace paraflow::cuda {

class DevicePool {
 public:
  // A block of at least `bytes` (rounded to a size class), not zeroed.
  void* allocate(size_t bytes);
  void release(void* block);

 private:
  static size_t size_class(size_t bytes);
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // size class -> block
  std::map<void*, size_t> sizes_;      // every block handed out -> its size class
};

// The process's pool, never destroyed: tensors may outlive static destruction order.
DevicePool& device_pool();

// A scratch buffer from the pool for one kernel launch, returned when it goes out of scope.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : data_(device_pool().allocate(bytes)) {}
  ~Scratch() { device_pool().release(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_;
};

}  // namespace paraflow::cuda
