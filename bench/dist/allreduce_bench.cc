// All-reduce latency and bandwidth of a communicator (MPI under mpirun, Gloo under TF_CONFIG):
// the time of an in-place float sum over message sizes from 4 B to 64 MiB, and the
// least-squares fit t(n) = alpha + beta * bytes used by docs/scaling.md.
//   mpirun --allow-run-as-root -np 2 build/bench/dist/allreduce_bench
//   tests/dist/launch_tf_config.sh 2 build/bench/dist/allreduce_bench
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "dist/communicator.h"
#include "machine.h"

using namespace paraflow::dist;

int main() {
  std::unique_ptr<Communicator> communicator;
  if (launched_by_mpi()) {
    communicator = make_mpi_communicator();
  } else if (auto spec = ClusterSpec::from_environment()) {
    communicator = make_gloo_communicator(*spec, std::chrono::seconds(60));
  } else {
    fmt::print(stderr, "run under mpirun or with TF_CONFIG\n");
    return 2;
  }
  std::vector<double> sizes, times;
  std::vector<float> buffer(static_cast<size_t>(16) << 20);
  if (communicator->rank() == 0) {
    fmt::print("# cpu {}\n# {} all-reduce on {} ranks\n# bytes  median_us  busbw_GBps\n", paraflow::bench::cpu_model(),
               communicator->name(), communicator->size());
  }
  for (size_t count = 1; count <= buffer.size(); count *= 4) {
    int repeats = count < (1u << 16) ? 50 : count < (1u << 22) ? 10 : 4;
    std::vector<double> samples;
    communicator->barrier();
    for (int r = 0; r < repeats; ++r) {
      auto start = std::chrono::steady_clock::now();
      communicator->all_reduce_sum(buffer.data(), count);
      samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(samples.begin(), samples.end());
    double median = samples[samples.size() / 2];
    double bytes = static_cast<double>(count * sizeof(float));
    // Bus bandwidth as NCCL defines it for all-reduce: bytes * 2(p-1)/p / time.
    double p = communicator->size();
    if (communicator->rank() == 0) fmt::print("{:>10.0f} {:>10.1f} {:>10.3f}\n", bytes, median * 1e6, bytes * 2 * (p - 1) / p / median / 1e9);
    sizes.push_back(bytes);
    times.push_back(median);
  }
  // Least squares for t = alpha + beta * bytes.
  double n = static_cast<double>(sizes.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sx += sizes[i];
    sy += times[i];
    sxx += sizes[i] * sizes[i];
    sxy += sizes[i] * times[i];
  }
  double beta = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  double alpha = times.front();  // the smallest message is latency-bound: a cleaner alpha than the intercept
  if (communicator->rank() == 0) {
    fmt::print("alpha_us {:.1f}\nbeta_ns_per_byte {:.4f}\nasymptotic_GBps {:.2f}\n", alpha * 1e6, beta * 1e9, 1e-9 / beta);
  }
  return 0;
}
