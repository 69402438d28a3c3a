// default_backend(): the GPU where one is present; otherwise the CPU, and a build with the CUDA
// backend says so once on stderr (not once per call), after which kernels still run.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"

namespace paraflow {
namespace {

int occurrences(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(DefaultBackendTest, UsesTheGpuOrSaysOnceThatItUsesTheCpu) {
  const bool gpu_present = available_backends().size() > 1;
  ::testing::internal::CaptureStderr();
  Backend& first = default_backend();
  Backend& second = default_backend();
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(&first, &second);
  if (gpu_present) {
    EXPECT_EQ(first.device().kind, DeviceKind::cuda);
    EXPECT_EQ(occurrences(said, "using the CPU"), 0) << said;
    return;
  }
  EXPECT_EQ(&first, &cpu_backend());
#ifdef PARAFLOW_CUDA
  EXPECT_EQ(occurrences(said, "no GPU ("), 1) << said;
  EXPECT_EQ(occurrences(said, "using the CPU"), 1) << said;
#else
  EXPECT_EQ(said, "") << "a build without the CUDA backend has nothing to fall back from";
#endif
  // The run goes on on the CPU: a kernel launched on the backend it got.
  Tensor a = first.upload(std::vector<float>{1.5f, -2.0f}, {2}, DType::f32);
  Tensor b = first.upload(std::vector<float>{0.25f, 4.0f}, {2}, DType::f32);
  Tensor sum = first.empty({2}, DType::f32);
  first.launch(AddForward{.out = sum, .a = a, .b = b});
  EXPECT_EQ(first.download<float>(sum), (std::vector<float>{1.75f, 2.0f}));
}

}  // namespace
}  // namespace paraflow
