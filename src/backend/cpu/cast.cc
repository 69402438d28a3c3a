#include "backend/cpu/kernels.h"
#include "base/error.h"

namespace paraflow::cpu {

namespace {

inline float load(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

inline void store(void* data, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::bf16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(value); break;
    case DType::f16: static_cast<uint16_t*>(data)[i] = f32_to_f16(value); break;
    default: static_cast<float*>(data)[i] = value;
  }
}

}  // namespace

void cast(const Cast& args) {
  const DType src_dtype = args.src.dtype(), dst_dtype = args.dst.dtype();
  const void* src = args.src.device_address();
  void* dst = args.dst.device_address();
  const int64_t n = args.src.numel();
  const bool accumulate = args.accumulate;
  for (DType dtype : {src_dtype, dst_dtype}) {
    if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
      throw Error(fmt::format("cast: {} is not a floating-point storage type", dtype_name(dtype)));
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float value = load(src, src_dtype, i);
    if (accumulate) value += load(dst, dst_dtype, i);
    store(dst, dst_dtype, i, value);
  }
}

}  // namespace paraflow::cpu
