#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

void embedding_forward(const EmbeddingForward& args) {
  const int64_t B = args.tokens.shape()[0], T = args.tokens.shape()[1], C = args.wte.shape()[1];
  const int64_t position0 = args.position0;
  const int32_t* tokens = pointer<int32_t>(args.tokens);
  const float *wte = pointer<float>(args.wte), *wpe = pointer<float>(args.wpe);
  float* out = pointer<float>(args.out);
  const int32_t* positions = args.positions.defined() ? args.positions.data<int32_t>() : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* token_row = wte + static_cast<int64_t>(tokens[bt]) * C;
    const float* position_row = wpe + (positions ? positions[bt] : position0 + bt % T) * C;
    float* out_row = out + bt * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out_row[c] = token_row[c] + position_row[c];
  }
}

void embedding_backward(const EmbeddingBackward& args) {
  const int64_t B = args.tokens.shape()[0], T = args.tokens.shape()[1], C = args.dwte.shape()[1];
  const int32_t* tokens = pointer<int32_t>(args.tokens);
  const float* dout = pointer<float>(args.dout);
  float *dwte = pointer<float>(args.dwte), *dwpe = pointer<float>(args.dwpe);
  // Each thread owns a band of channels and walks every position in order: no races, and the
  // sum order does not depend on the thread count.
  constexpr int64_t kBand = 16;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBand) {
    int64_t c1 = c0 + kBand < C ? c0 + kBand : C;
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* dout_row = dout + bt * C;
      float* dwte_row = dwte + static_cast<int64_t>(tokens[bt]) * C;
      float* dwpe_row = dwpe + (bt % T) * C;
      for (int64_t c = c0; c < c1; ++c) {
        dwte_row[c] += dout_row[c];
        dwpe_row[c] += dout_row[c];
      }
    }
  }
}

}  // namespace paraflow::cpu
