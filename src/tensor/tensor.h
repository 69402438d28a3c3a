// Shape, Device and Tensor: a typed, shaped view of a reference-counted buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace paraflow {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int64_t numel() const;
  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t axis) const { return dims_.at(axis); }
  const std::vector<int64_t>& dims() const { return dims_; }
  bool operator==(const Shape& other) const { return dims_ == other.dims_; }
  std::string to_string() const;  // "[2, 3]"

 private:
  std::vector<int64_t> dims_;
};

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string to_string() const;
};

// Owns device memory; frees it through the deleter of the allocator that made it. Memory the
// host may not touch (a GPU's, or the opaque test backend's) is reached only through its
// backend's copies and kernels.
class Storage {
 public:
  Storage(void* data, size_t bytes, Device device, bool host_accessible, std::function<void(void*)> deleter)
      : data_(data), bytes_(bytes), device_(device), host_accessible_(host_accessible), deleter_(std::move(deleter)) {}
  ~Storage() { if (data_) deleter_(data_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool host_accessible() const { return host_accessible_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  bool host_accessible_;
  std::function<void(void*)> deleter_;
};

// 64-byte-aligned host memory, zero-filled.
std::shared_ptr<Storage> allocate_host(size_t bytes);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype);

  // Zero-filled host tensor.
  static Tensor zeros(Shape shape, DType dtype = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return dtype_bytes(dtype_, numel()); }

  bool host_accessible() const { return storage_->host_accessible(); }

  // Host access, checked: the tensor must live in host-accessible memory (elsewhere, copy it
  // with Backend::download / upload), and T must match the dtype (a block-quantized type's T is
  // its block).
  template <typename T>
  T* data() const {
    check_host_access();
    check_element_type(sizeof(T));
    return static_cast<T*>(device_address());
  }
  void* raw() const {
    check_host_access();
    return device_address();
  }

  // The address in the tensor's own device memory, for that device's kernels and copies only.
  void* device_address() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* device_data() const {
    check_element_type(sizeof(T));
    return static_cast<T*>(device_address());
  }

  // Same bytes, another shape with the same element count.
  Tensor reshape(Shape shape) const;
  // Elements [begin, begin + count) of the flattened tensor, as a 1-D view (whole blocks of a
  // block-quantized type).
  Tensor slice_flat(int64_t begin, int64_t count) const;
  // Another tensor living in this one's storage at `byte_offset` (memory planning's arena).
  Tensor view(size_t byte_offset, Shape shape, DType dtype) const;

 private:
  void check_element_type(size_t element_size) const;
  void check_host_access() const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace paraflow
