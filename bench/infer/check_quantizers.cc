// Our Q4_K and Q5_0 quantizers (tensor/quantized.h) against llama.cpp's own, quantize_row_q4_K_ref
// and quantize_row_q5_0_ref from the ggml that bench/infer/build_llama_cpp.sh builds (what
// llama-quantize runs without an importance matrix): the blocks compared byte for byte over rows
// of several kinds, and each side's RMS error. Built and run by bench/infer/check_quantizers.sh
// (not a unit test: it needs the bench-only llama.cpp build).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/quantized.h"

extern "C" void quantize_row_q4_K_ref(const float* x, void* y, int64_t k);
extern "C" void dequantize_row_q4_K(const void* x, float* y, int64_t k);
extern "C" void quantize_row_q5_0_ref(const float* x, void* y, int64_t k);
extern "C" void dequantize_row_q5_0(const void* x, float* y, int64_t k);

namespace {

// One type's two quantizers and dequantizers.
struct Format {
  const char* name;
  paraflow::DType dtype;
  void (*quantize_theirs)(const float*, void*, int64_t);
  void (*dequantize_theirs)(const void*, float*, int64_t);
};

}  // namespace

int main() {
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
  for (const Format& format : {Format{"Q4_K", paraflow::DType::q4_k, quantize_row_q4_K_ref, dequantize_row_q4_K},
                               Format{"Q5_0", paraflow::DType::q5_0, quantize_row_q5_0_ref, dequantize_row_q5_0}}) {
    for (const Kind& kind : kinds) {
      const int64_t blocks = count / paraflow::dtype_block_elements(format.dtype);
      const size_t block_bytes = paraflow::dtype_block_bytes(format.dtype);
      std::vector<char> ours(blocks * block_bytes), theirs(blocks * block_bytes);
      paraflow::quantize_blocks(format.dtype, kind.values.data(), ours.data(), count);
      format.quantize_theirs(kind.values.data(), theirs.data(), count);
      int64_t same = 0;
      for (int64_t b = 0; b < blocks; ++b) same += std::memcmp(&ours[b * block_bytes], &theirs[b * block_bytes], block_bytes) == 0;
      std::vector<float> ours_back(count), theirs_back(count);
      paraflow::dequantize_blocks(format.dtype, ours.data(), ours_back.data(), count);
      format.dequantize_theirs(theirs.data(), theirs_back.data(), count);
      double ours_error = 0, theirs_error = 0, power = 0;
      for (int64_t i = 0; i < count; ++i) {
        ours_error += std::pow(ours_back[i] - kind.values[i], 2.0);
        theirs_error += std::pow(theirs_back[i] - kind.values[i], 2.0);
        power += std::pow(kind.values[i], 2.0);
      }
      std::printf("%s %-34s blocks identical %lld / %lld   relative RMS error ours %.6f llama.cpp %.6f\n", format.name, kind.name.c_str(),
                  static_cast<long long>(same), static_cast<long long>(blocks), std::sqrt(ours_error / power),
                  std::sqrt(theirs_error / power));
      mismatches += same != blocks;
    }
  }
  std::printf(mismatches == 0 ? "all blocks identical\n" : "%d type and kind pairs with differing blocks\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
