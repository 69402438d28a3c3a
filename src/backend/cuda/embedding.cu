// Token + position embedding (f32). The backward pass gives each thread one channel and walks
// every position in order, as the CPU's bands do: no atomics, the same sums on every run.
#include "backend/cuda/device_math.cuh"

namespace paraflow::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                         const int32_t* positions, int64_t position0, int64_t T, int64_t C, int64_t V,
                                         int64_t vocab_begin, bool add_positions) {
  const int64_t bt = blockIdx.x;
  const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
  const bool mine = row >= 0 && row < V;  // a vocabulary shard adds only its own rows
  const float* token_row = wte + (mine ? row : 0) * C;
  const float token_weight = mine ? 1.0f : 0.0f;
  const float* position_row =
      add_positions ? wpe + (positions != nullptr ? positions[bt] : position0 + bt % T) * C : nullptr;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    out[bt * C + c] = token_weight * token_row[c] + (position_row != nullptr ? position_row[c] : 0.0f);
  }
}

__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                          int64_t BT, int64_t T, int64_t C, int64_t V, int64_t vocab_begin) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t bt = 0; bt < BT; ++bt) {
    const float g = dout[bt * C + c];
    const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
    if (row >= 0 && row < V) dwte[row * C + c] += g;
    if (dwpe != nullptr) dwpe[(bt % T) * C + c] += g;
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, const int32_t* positions,
                       int64_t position0, int64_t B, int64_t T, int64_t C, int64_t V, int64_t vocab_begin,
                       bool add_positions) {
  embedding_forward_kernel<<<static_cast<unsigned>(B * T), kThreads, 0, stream()>>>(
      out, tokens, wte, wpe, positions, position0, T, C, V, vocab_begin, add_positions);
  check_launch("embedding_forward");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, int64_t V, int64_t vocab_begin, bool add_positions) {
  embedding_backward_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream()>>>(
      dwte, add_positions ? dwpe : nullptr, dout, tokens, B * T, T, C, V, vocab_begin);
  check_launch("embedding_backward");
}

}  // namespace paraflow::cuda
