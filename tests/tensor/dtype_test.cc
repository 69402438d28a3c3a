// 16-bit float conversions: the portable code (used on CPUs without F16C) against the hardware
// conversion where this CPU has it, over every half-precision bit pattern and many floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "base/random.h"
#include "tensor/dtype.h"

namespace paraflow {
namespace {

TEST(DType, HalfPrecisionConversionsAgreeWithTheHardware) {
#if !defined(__F16C__)
  GTEST_FAIL() << "this test needs a CPU with F16C to compare against";
#else
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float hardware = _cvtsh_ss(static_cast<uint16_t>(bits)), portable = f16_to_f32_portable(static_cast<uint16_t>(bits));
    if (std::isnan(hardware)) {
      EXPECT_TRUE(std::isnan(portable)) << bits;
    } else {
      EXPECT_EQ(std::memcmp(&hardware, &portable, 4), 0) << bits;
    }
  }
  Rng rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Magnitudes from far below the smallest subnormal to beyond the largest half.
    float value = static_cast<float>((rng.uniform() - 0.5) * std::ldexp(1.0, static_cast<int>(rng.below(60)) - 30));
    EXPECT_EQ(f32_to_f16_portable(value), _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT)) << value;
  }
#endif
}

TEST(DType, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.8p-8f), 0x3F81);
  EXPECT_EQ(bf16_to_f32(0xC020), -2.5f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

}  // namespace
}  // namespace paraflow
