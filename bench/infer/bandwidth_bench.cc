// Memory read bandwidth of this machine: OpenMP threads each sum their share of a buffer much
// larger than the caches (default 1 GiB of 64-bit words, touched first by the same threads);
// best of several passes. The buffer is 2 MiB-aligned and advised to use transparent huge pages
// (on a 4 KiB-page buffer this VM reads ~35% slower, presumably TLB misses and prefetchers stopping at
// page ends), so the figure is the upper bound a decoder can approach. Prints `read_gb_per_s X`
// (1 GB = 1e9 bytes) for compare_decode.py.
//   OMP_NUM_THREADS=2 build/bench/infer/bandwidth_bench [--mib 1024] [--passes 10] [--huge-pages false]
#include <fmt/format.h>
#include <omp.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "backend/cpu/gemm.h"
#include "machine.h"

int main(int argc, char** argv) {
  CLI::App app{"memory read bandwidth"};
  int64_t mib = 1024, passes = 10;
  bool huge_pages = true;
  app.add_option("--mib", mib, "Buffer size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--passes", passes, "Timed passes over the buffer (the best counts)")->check(CLI::PositiveNumber);
  app.add_option("--huge-pages", huge_pages, "madvise(MADV_HUGEPAGE) on the buffer");
  CLI11_PARSE(app, argc, argv);

  const size_t bytes = static_cast<size_t>(mib) << 20, words = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[], decltype(&std::free)> buffer(static_cast<uint64_t*>(std::aligned_alloc(2 << 20, bytes)),
                                                           &std::free);
  uint64_t* data = buffer.get();  // summing through the unique_ptr instead ran at ~60% of this speed
  if (huge_pages && madvise(data, bytes, MADV_HUGEPAGE) != 0) fmt::print(stderr, "madvise(MADV_HUGEPAGE) failed\n");
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < words; ++i) data[i] = i;

  double best = 0;
  uint64_t checksum = 0;
  for (int64_t pass = 0; pass < passes; ++pass) {
    uint64_t sum = 0;
    auto start = std::chrono::steady_clock::now();
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < words; ++i) sum += data[i];
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) / seconds / 1e9);
    checksum += sum;
  }
  fmt::print("cpu {}\nonednn_isa {}\n", paraflow::bench::cpu_model(), paraflow::cpu::onednn_isa_name());
  fmt::print("threads {}\nbuffer_mib {}\nhuge_pages {}\npasses {}\nchecksum {}\nread_gb_per_s {:.2f}\n",
             omp_get_max_threads(), mib, huge_pages, passes, checksum, best);
}
