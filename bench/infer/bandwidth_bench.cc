// Memory read bandwidth of this machine: OpenMP threads each sum their share of a buffer much
// larger than the caches (default 1 GiB of 64-bit words, touched first by the same threads);
// best of several passes. Prints `read_gb_per_s X` (1 GB = 1e9 bytes) for compare_decode.py.
//   OMP_NUM_THREADS=2 build/bench/infer/bandwidth_bench [--mib 1024] [--passes 10]
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

int main(int argc, char** argv) {
  CLI::App app{"memory read bandwidth"};
  int64_t mib = 1024, passes = 10;
  app.add_option("--mib", mib, "Buffer size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--passes", passes, "Timed passes over the buffer (the best counts)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const int64_t words = mib * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(uint64_t));
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[words]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < words; ++i) buffer[i] = static_cast<uint64_t>(i);

  double best = 0;
  uint64_t checksum = 0;
  for (int64_t pass = 0; pass < passes; ++pass) {
    uint64_t sum = 0;
    auto start = std::chrono::steady_clock::now();
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < words; ++i) sum += buffer[i];
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds / 1e9);
    checksum += sum;
  }
  fmt::print("threads {}\nbuffer_mib {}\npasses {}\nchecksum {}\nread_gb_per_s {:.2f}\n", omp_get_max_threads(), mib,
             passes, checksum, best);
}
