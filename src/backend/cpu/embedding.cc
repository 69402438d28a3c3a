#include "backend/cpu/kernels.h"

namespace paraflow::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, int64_t position0) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* token_row = wte + static_cast<int64_t>(tokens[bt]) * C;
    const float* position_row = wpe + (position0 + bt % T) * C;
    float* out_row = out + bt * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out_row[c] = token_row[c] + position_row[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C) {
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
