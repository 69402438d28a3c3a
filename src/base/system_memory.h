// How much memory this process can still get: the kernel's MemAvailable, or less when a cgroup
// (a container's memory limit) leaves less.
#pragma once

#include <cstdint>

namespace paraflow {

int64_t available_memory_bytes();

}  // namespace paraflow
