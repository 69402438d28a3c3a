#include "backend/cpu/kernels.h"

#include <algorithm>

#include "tensor/quantized.h"

namespace paraflow::cpu {

void embedding_forward(const EmbeddingForward& args) {
  const int64_t B = args.tokens.shape()[0], T = args.tokens.shape()[1], C = args.wte.shape()[1];
  const int64_t position0 = args.position0;
  const int32_t* tokens = pointer<int32_t>(args.tokens);
  const float* wpe = args.add_positions ? pointer<float>(args.wpe) : nullptr;
  float* out = pointer<float>(args.out);
  const int32_t* positions = args.positions.defined() ? args.positions.data<int32_t>() : nullptr;
  const int64_t V = args.wte.shape()[0], vocab_begin = args.vocab_begin;
  // wte in f32, or as a model file stores it (bf16, f16, block-quantized: a decoding graph reads
  // the token table there), each row looked up converted into its output row.
  const DType stored = args.wte.dtype();
  const float* wte = stored == DType::f32 ? pointer<float>(args.wte) : nullptr;
  const char* wte_bytes = static_cast<const char*>(args.wte.device_address());
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
    float* out_row = out + bt * C;
    if (row < 0 || row >= V) {  // another shard's token
      std::fill(out_row, out_row + C, 0.0f);
    } else if (wte == nullptr) {
      stored_values_as_f32(stored, wte_bytes + dtype_bytes(stored, row * C), out_row, C);
    } else {
      const float* token_row = wte + (args.wte_interleaved ? interleaved_offset(row, 0, V, C) : row * C);
      const int64_t stride = args.wte_interleaved ? interleaved_column_stride(row, V) : 1;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out_row[c] = token_row[c * stride];
    }
    if (wpe == nullptr) continue;  // (wpe may be absent: a model without a position table)
    const float* position_row = wpe + (positions ? positions[bt] : position0 + bt % T) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out_row[c] += position_row[c];
  }
}

void embedding_backward(const EmbeddingBackward& args) {
  const int64_t B = args.tokens.shape()[0], T = args.tokens.shape()[1], C = args.dwte.shape()[1];
  const int32_t* tokens = pointer<int32_t>(args.tokens);
  const float* dout = pointer<float>(args.dout);
  float* dwte = pointer<float>(args.dwte);
  float* dwpe = args.add_positions ? pointer<float>(args.dwpe) : nullptr;
  const int64_t V = args.dwte.shape()[0], vocab_begin = args.vocab_begin;
  // Each thread owns a band of channels and walks every position in order: no races, and the
  // sum order does not depend on the thread count.
  constexpr int64_t kBand = 16;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBand) {
    int64_t c1 = c0 + kBand < C ? c0 + kBand : C;
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* dout_row = dout + bt * C;
      const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
      if (row >= 0 && row < V) {
        float* dwte_row = dwte + row * C;
        for (int64_t c = c0; c < c1; ++c) dwte_row[c] += dout_row[c];
      }
      if (dwpe != nullptr) {
        float* dwpe_row = dwpe + (bt % T) * C;
        for (int64_t c = c0; c < c1; ++c) dwpe_row[c] += dout_row[c];
      }
    }
  }
}

}  // namespace paraflow::cpu
