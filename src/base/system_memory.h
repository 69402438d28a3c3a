// How much memory this process can still get: the kernel's MemAvailable, or less when a cgroup
// (a container's memory limit) leaves less; and letting go of a file mapping's pages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace paraflow {

int64_t available_memory_bytes();

// Lets the kernel drop the pages of [at, at + bytes) from this process's resident memory, for a
// read-only private file mapping only (there they stay in the page cache and are read again if
// touched again; anonymous memory would read back as zeros). The pages at either end are dropped
// whole, their neighbours' bytes too, which costs those a page fault at most.
void release_mapped_pages(const void* at, size_t bytes);

}  // namespace paraflow
