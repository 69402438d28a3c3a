#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

void embedding_forward(const EmbeddingForward& args) {
  const int64_t B = args.tokens.shape()[0], T = args.tokens.shape()[1], C = args.wte.shape()[1];
  const int64_t position0 = args.position0;
  const int32_t* tokens = pointer<int32_t>(args.tokens);
  const float *wte = pointer<float>(args.wte), *wpe = pointer<float>(args.wpe);
  float* out = pointer<float>(args.out);
  const int32_t* positions = args.positions.defined() ? args.positions.data<int32_t>() : nullptr;
  const int64_t V = args.wte.shape()[0], vocab_begin = args.vocab_begin;
  const bool add_positions = args.add_positions;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
    const bool mine = row >= 0 && row < V;
    const int64_t token = mine ? row : 0;
    const float* token_row = wte + (args.wte_interleaved ? interleaved_offset(token, 0, V, C) : token * C);
    const int64_t stride = args.wte_interleaved ? interleaved_column_stride(token, V) : 1;
    float* out_row = out + bt * C;
    const float token_weight = mine ? 1.0f : 0.0f;
    if (!add_positions) {  // (wpe may be absent: a model without a position table)
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out_row[c] = token_weight * token_row[c * stride];
      continue;
    }
    const float* position_row = wpe + (positions ? positions[bt] : position0 + bt % T) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out_row[c] = token_weight * token_row[c * stride] + position_row[c];
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
