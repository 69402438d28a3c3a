// How much memory this process can still get, and handing pages of a buffer back to the kernel.
#pragma once

#include <cstdint>

namespace paraflow {

// The kernel's MemAvailable, or less when a cgroup (a container's memory limit) leaves less.
int64_t available_memory_bytes();

// Hands the whole pages inside [begin, end) back to the kernel (a page shared with the bytes
// around stays): they cost nothing until written again, and read as zeros. Host memory only.
void release_pages(void* begin, void* end);

// data[0, count) = 0, its whole pages released rather than written (see release_pages).
void zero_releasing_pages(float* data, int64_t count);

}  // namespace paraflow
