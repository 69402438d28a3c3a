// Our Q4_K quantizer (tensor/quantized.h) against llama.cpp's own, quantize_row_q4_K_ref from the
// ggml that bench/infer/build_llama_cpp.sh builds (what llama-quantize runs without an importance
// matrix): the blocks compared byte for byte over rows of several kinds, and each side's RMS
// error. Built and run by bench/infer/check_q4_k_quantizer.sh (not a unit test: it needs the
// bench-only llama.cpp build).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/quantized.h"

extern "C" void quantize_row_q4_K_ref(const float* x, void* y, int64_t k);
extern "C" void dequantize_row_q4_K(const void* x, float* y, int64_t k);

int main() {
  using paraflow::BlockQ4_K;
  std::mt19937 engine(48);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(3.0f);  // weights' heavy tails
  struct Kind {
    std::string name;
    std::vector<float> values;
  };
  std::vector<Kind> kinds;
  const int64_t count = 256 * 20000;
  for (float scale : {0.02f, 1.0f, 300.0f}) {
    Kind kind{"normal x " + std::to_string(scale), {}};
    for (int64_t i = 0; i < count; ++i) kind.values.push_back(scale * normal(engine));
    kinds.push_back(std::move(kind));
  }
  Kind tails{"student-t(3) x 0.02", {}};
  for (int64_t i = 0; i < count; ++i) tails.values.push_back(0.02f * heavy(engine));
  kinds.push_back(std::move(tails));
  Kind shifted{"normal + 0.5 (positive-leaning)", {}};
  for (int64_t i = 0; i < count; ++i) shifted.values.push_back(0.5f + 0.1f * normal(engine));
  kinds.push_back(std::move(shifted));
  int mismatches = 0;
  for (const Kind& kind : kinds) {
    const int64_t blocks = count / 256;
    std::vector<BlockQ4_K> ours(blocks), theirs(blocks);
    paraflow::quantize_q4_k(kind.values.data(), ours.data(), count);
    quantize_row_q4_K_ref(kind.values.data(), theirs.data(), count);
    int64_t same = 0;
    for (int64_t b = 0; b < blocks; ++b) same += std::memcmp(&ours[b], &theirs[b], sizeof(BlockQ4_K)) == 0;
    std::vector<float> ours_back(count), theirs_back(count);
    paraflow::dequantize_q4_k(ours.data(), ours_back.data(), count);
    dequantize_row_q4_K(theirs.data(), theirs_back.data(), count);
    double ours_error = 0, theirs_error = 0, power = 0;
    for (int64_t i = 0; i < count; ++i) {
      ours_error += std::pow(ours_back[i] - kind.values[i], 2.0);
      theirs_error += std::pow(theirs_back[i] - kind.values[i], 2.0);
      power += std::pow(kind.values[i], 2.0);
    }
    std::printf("%-34s blocks identical %lld / %lld   relative RMS error ours %.6f llama.cpp %.6f\n", kind.name.c_str(),
                static_cast<long long>(same), static_cast<long long>(blocks), std::sqrt(ours_error / power),
                std::sqrt(theirs_error / power));
    mismatches += same != blocks;
  }
  std::printf(mismatches == 0 ? "all blocks identical\n" : "%d kinds with differing blocks\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
