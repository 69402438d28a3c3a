// Elapsed wall time, for step timings and rates.
#pragma once

#include <chrono>

namespace paraflow {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace paraflow
