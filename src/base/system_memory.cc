#include "base/system_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

namespace paraflow {

namespace {

// The first number in `path` after `key` ("" for the file's first word); -1 when absent.
int64_t read_number(const char* path, const std::string& key) {
  std::ifstream file(path);
  std::string word;
  while (file >> word) {
    if (!key.empty() && word != key) continue;
    if (!key.empty() && !(file >> word)) return -1;
    try {
      return std::stoll(word);
    } catch (const std::exception&) {
      return -1;  // "max": no limit
    }
  }
  return -1;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t available = read_number("/proc/meminfo", "MemAvailable:") * 1024;
  if (available < 0) available = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  // cgroup v2: the limit less what the group already uses.
  const int64_t limit = read_number("/sys/fs/cgroup/memory.max", "");
  const int64_t used = read_number("/sys/fs/cgroup/memory.current", "");
  if (limit >= 0 && used >= 0) available = std::min(available, std::max<int64_t>(limit - used, 0));
  return available;
}

namespace {

uintptr_t page_size() { return static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)); }
uintptr_t page_up(const void* at) { return (reinterpret_cast<uintptr_t>(at) + page_size() - 1) / page_size() * page_size(); }
uintptr_t page_down(const void* at) { return reinterpret_cast<uintptr_t>(at) / page_size() * page_size(); }

}  // namespace

void release_mapped_pages(const void* at, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t begin = page_down(at), end = reinterpret_cast<uintptr_t>(at) + bytes;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice: failure leaves the pages
}

void release_pages(void* begin, void* end) {
  const uintptr_t first = page_up(begin), last = page_down(end);
  if (first < last) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void keep_small_pages(void* begin, void* end) {
  const uintptr_t first = page_up(begin), last = page_down(end);
  if (first < last) madvise(reinterpret_cast<void*>(first), last - first, MADV_NOHUGEPAGE);  // advice: failure is harmless
}

void zero_releasing_pages(float* data, int64_t count) {
  float* const end = data + count;
  // The partial pages at either end are written; the whole ones between are released.
  float* const first = std::min(end, reinterpret_cast<float*>(page_up(data)));
  float* const last = std::max(first, reinterpret_cast<float*>(page_down(end)));
  std::memset(data, 0, static_cast<size_t>(first - data) * sizeof(float));
  std::memset(last, 0, static_cast<size_t>(end - last) * sizeof(float));
  release_pages(first, last);
}

}  // namespace paraflow
