// exp() written so that `#pragma omp simd` loops vectorise it (glibc's expf does not without
// -ffast-math): Cody-Waite reduction x = n·ln2 + r, |r| <= ln2/2, a degree-7 Taylor polynomial
// (truncation error < 6e-9, below float's half-ulp), and 2^n built in the exponent bits.
// Inputs below -87 give e^-87 (~1.6e-38) instead of a denormal or 0; callers use it for
// softmax-style sums where that difference is far below rounding.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace paraflow::cpu {

#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln2) by the 1.5·2^23 trick: std::floor would keep GCC from vectorising the
  // loop at all (without -ffast-math), which it silently did before.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh through exp, saturating correctly for large |u|.
#pragma omp declare simd notinbranch
inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

}  // namespace paraflow::cpu
