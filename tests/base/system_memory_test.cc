// zero_releasing_pages: the range reads as zeros, the bytes around it are untouched, and its whole
// pages are no longer resident (mincore), so zeroing a gradient buffer costs no memory.
#include "base/system_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

namespace paraflow {
namespace {

// How many of the pages of [begin, end) are resident.
size_t resident_pages(const void* begin, const void* end) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(end) + page - 1) / page * page;
  std::vector<unsigned char> in_core((last - first) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(first), last - first, in_core.data()), 0);
  size_t count = 0;
  for (unsigned char flags : in_core) count += flags & 1;
  return count;
}

TEST(SystemMemory, ZeroReleasingPagesZeroesTheRangeAndReleasesItsWholePages) {
  const size_t page_floats = static_cast<size_t>(sysconf(_SC_PAGESIZE)) / sizeof(float);
  // Its own mapping, so that no allocator touches the pages behind the test's back.
  const size_t floats = 16 * page_floats;
  void* mapping = mmap(nullptr, floats * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  float* data = static_cast<float*>(mapping);
  std::fill(data, data + floats, 1.5f);
  ASSERT_EQ(resident_pages(data, data + floats), 16u);
  // From the middle of page 1 to the middle of page 11: pages 2..10 are whole.
  const size_t begin = page_floats + 100, end = 11 * page_floats + 7;
  zero_releasing_pages(data + begin, static_cast<int64_t>(end - begin));
  EXPECT_EQ(resident_pages(data, data + floats), 16u - 9u);
  EXPECT_EQ(resident_pages(data + 2 * page_floats, data + 11 * page_floats), 0u);
  for (size_t i = 0; i < floats; ++i) {
    ASSERT_EQ(data[i], i >= begin && i < end ? 0.0f : 1.5f) << "element " << i;
  }
  // Within one page: written, nothing released.
  zero_releasing_pages(data + 3, 5);
  EXPECT_EQ(data[2], 1.5f);
  EXPECT_EQ(data[3], 0.0f);
  EXPECT_EQ(data[7], 0.0f);
  EXPECT_EQ(data[8], 1.5f);
  EXPECT_EQ(resident_pages(data, data + page_floats), 1u);
  munmap(mapping, floats * sizeof(float));
}

}  // namespace
}  // namespace paraflow
