#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/half_products.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/q8_0_products.h"
#include "backend/cpu/storage.h"
#include "backend/quantized_tiles.h"
#include "base/error.h"
#include "tensor/quantized.h"

namespace paraflow {

namespace {

void register_cpu_kernels(KernelRegistry& registry) {
  constexpr DeviceKind cpu = DeviceKind::cpu;
  // The token table in f32, or as a model file stores it (a decoding graph reads it there).
  for (DType table : {DType::f32, DType::bf16, DType::f16, DType::q8_0, DType::q4_k, DType::q5_0}) {
    registry.add(cpu, table, &cpu::embedding_forward);
  }
  registry.add(cpu, DType::f32, &cpu::embedding_backward);
  registry.add(cpu, DType::f32, &cpu::matmul_forward);
  registry.add(cpu, DType::f32, &cpu::matmul_backward);
  registry.add(cpu, DType::f32, &cpu::attention_forward);
  registry.add(cpu, DType::f32, &cpu::attention_backward);
  registry.add(cpu, DType::f32, &cpu::attention_cached_forward);
  registry.add(cpu, DType::f32, &cpu::attention_paged_forward);
  registry.add(cpu, DType::f32, &cpu::softmax_xent_forward);
  registry.add(cpu, DType::f32, &cpu::softmax_xent_backward);
  registry.add(cpu, DType::f32, &cpu::xent_row_max);
  registry.add(cpu, DType::f32, &cpu::xent_sum_exp);
  registry.add(cpu, DType::f32, &cpu::xent_finish);
  registry.add(cpu, DType::f32, &cpu::sum_squares);
  registry.add(cpu, DType::f32, &cpu::adamw_update);
  // Memory-bound kernels that read and write each storage type directly.
  auto add_storage_kernels = [&](DType dtype, auto element) {
    using T = decltype(element);
    registry.add(cpu, dtype, &cpu::layernorm_forward<T>);
    registry.add(cpu, dtype, &cpu::layernorm_backward<T>);
    registry.add(cpu, dtype, &cpu::rmsnorm_forward<T>);
    registry.add(cpu, dtype, &cpu::rmsnorm_backward<T>);
    registry.add(cpu, dtype, &cpu::rope_forward<T>);
    registry.add(cpu, dtype, &cpu::rope_backward<T>);
    registry.add(cpu, dtype, &cpu::swiglu_forward<T>);
    registry.add(cpu, dtype, &cpu::swiglu_backward<T>);
    registry.add(cpu, dtype, &cpu::add_forward<T>);
    registry.add(cpu, dtype, &cpu::add_backward<T>);
    registry.add(cpu, dtype, &cpu::cast);
  };
  add_storage_kernels(DType::f32, float{});
  add_storage_kernels(DType::bf16, cpu::BFloat16{});
  add_storage_kernels(DType::f16, cpu::Float16{});
  // The bf16 matmul's forward everywhere: decoding reads bf16 weights, half the bytes, and widens
  // them in registers where the CPU has no bf16 arithmetic. Training's bf16 GEMMs only where they
  // beat f32 ones: elsewhere (no bf16 arithmetic, or AVX512_BF16 at half the f32 rate) the
  // precision policy falls back to f32 copies (the backward kernel is missing).
  registry.add(cpu, DType::bf16, &cpu::matmul_forward_bf16);
  // Decoding's Q8_0 and Q4_K weights, read as packed blocks (backend/cpu/q8_0_products.h,
  // q4_k_products.h).
  registry.add(cpu, DType::q8_0, &cpu::matmul_forward_blocks<BlockQ8_0>);
  registry.add(cpu, DType::q4_k, &cpu::matmul_forward_blocks<BlockQ4_K>);
  registry.add(cpu, DType::q5_0, &cpu::matmul_forward_blocks<BlockQ5_0>);
  if (cpu::bf16_gemms_beat_f32()) {
    registry.add(cpu, DType::bf16, &cpu::matmul_backward_bf16);
    registry.add(cpu, DType::bf16, &cpu::attention_forward_bf16);
    registry.add(cpu, DType::bf16, &cpu::attention_backward_bf16);
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    register_cpu_kernels(kernel_registry());
    // PARAFLOW_GEMM is read now, so that a bad value stops every command at start-up (batch-1
    // decoding calls no f32 GEMM that would read it later).
    cpu::gemm_engine();
  }

  std::string name() const override { return "cpu"; }
  std::string describe() const override { return "cpu (oneDNN ISA " + cpu::onednn_isa_name() + ")"; }
  Device device() const override { return Device{}; }

  Tensor empty(Shape shape, DType dtype) override { return Tensor::zeros(std::move(shape), dtype); }
  void upload(const void* host, const Tensor& to) override { std::memcpy(to.raw(), host, to.nbytes()); }
  void download(const Tensor& from, void* host) override { std::memcpy(host, from.raw(), from.nbytes()); }
  void copy(const Tensor& from, const Tensor& to) override {
    if (from.nbytes() != to.nbytes()) {
      throw Error(fmt::format("copy of {} bytes into a {}-byte tensor", from.nbytes(), to.nbytes()));
    }
    std::memcpy(to.raw(), from.raw(), from.nbytes());
  }
  void fill_zero(const Tensor& tensor) override { std::memset(tensor.raw(), 0, tensor.nbytes()); }
  void synchronize() override {}
  bool multiplies_bf16_natively() const override { return cpu::has_native_bf16(); }
  bool multiplies_f16_natively() const override { return cpu::has_half_products(); }

  // Where the AVX2 kernel's outer products on 16-row panels match or beat the alternatives at
  // every row count: f32 weights (oneDNN's sgemm, for a prompt, measured level at 64-1024 rows),
  // bf16 weights without native bf16 (with it, the AVX512_BF16 kernel reads out_in rows, and
  // AMX out_in_tiles), and float16 weights without half products (widened as they are read).
  bool prefers_interleaved_weights(DType dtype) const override {
#if defined(__AVX2__) && defined(__FMA__)
    if (dtype == DType::f32) return true;
    if (dtype == DType::bf16) return !cpu::has_native_bf16();
    if (dtype == DType::f16) return !cpu::has_half_products();
#endif
    (void)dtype;
    return false;
  }
  // Where matmul_forward runs that layout: AMX for bf16 tiles, or vdpbf16ps pair products where
  // those issue at the f32 FMA rate (AVX512_BF16 dot products for the rows after the groups);
  // half products for float16 ones (f32 for the rows after them); AVX512_VNNI's tile products for
  // Q8_0, Q5_0 and Q4_K (their [out, in] rows' products for the rows after them).
  bool prefers_tiled_weights(DType dtype) const override {
    if (dtype == DType::f16) return cpu::has_half_products();
    if (is_block_quantized(dtype)) return has_quantized_tiles(dtype) && cpu::has_quantized_tile_products();
#ifdef __AVX512BF16__
    return dtype == DType::bf16 && (cpu::amx_tiles_available() || cpu::bf16_gemms_beat_f32());
#else
    return false;
#endif
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace paraflow
