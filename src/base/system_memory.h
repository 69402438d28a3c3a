// How much memory this process can still get, handing pages of a buffer back to the kernel, and
// letting go of a file mapping's pages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace paraflow {

// The kernel's MemAvailable, or less when a cgroup (a container's memory limit) leaves less.
int64_t available_memory_bytes();

// Lets the kernel drop the pages of [at, at + bytes) from this process's resident memory, for a
// read-only private file mapping only (there they stay in the page cache and are read again if
// touched again; anonymous memory would read back as zeros). The pages at either end are dropped
// whole, their neighbours' bytes too, which costs those a page fault at most.
void release_mapped_pages(const void* at, size_t bytes);

// Hands the whole pages inside [begin, end) back to the kernel (a page shared with the bytes
// around stays): they cost nothing until written again, and read as zeros. Host memory only.
void release_pages(void* begin, void* end);

// Asks the kernel to back the whole pages inside [begin, end) with small pages only (no 2 MiB
// transparent huge pages, which allocate_host asks for): writing a few bytes there then costs a
// 4 KiB page, not 2 MiB. For a buffer that may be written only in places. Host memory only.
void keep_small_pages(void* begin, void* end);

// data[0, count) = 0, its whole pages released rather than written (see release_pages).
void zero_releasing_pages(float* data, int64_t count);

}  // namespace paraflow
