// The machine a benchmark ran on, printed with its results: sessions run on different CPUs, and
// a number means little without the CPU model (and, for compute, the ISA oneDNN dispatches).
#pragma once

#include <fstream>
#include <string>

namespace paraflow::bench {

// The first "model name" of /proc/cpuinfo, or "unknown".
inline std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace paraflow::bench
