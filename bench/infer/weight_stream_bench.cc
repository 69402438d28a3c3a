// How close batch-1 decoding's matmuls come to reading their weights at the machine's plain read
// rate, and where the rest goes. The weights of a GPT-2 124M-shaped decoder's linear layers
// ([out, in], 48 matrices, the head left out), in the backend's memory, are read three ways in
// turn, many times in one process (the machine's speed drifts between runs, so only ratios from
// one run mean anything):
//   one_region   a plain sum over one buffer of the same size (the read bandwidth the decode bound
//                of compare_decode.py uses, at this size)
//   per_matrix   a plain sum over the 48 matrices one after the other, one parallel loop each (what
//                any decoder that runs its products one by one can reach at best)
//   matmul       the backend's matmul over the same matrices, in the decoder's order (one input
//                row, bias, GELU after the first MLP product, outputs in the weights' type), each
//                weight in the layout decoding stores it in on this CPU (the values' arrangement
//                does not change the bytes read)
// and prints each one's median GB/s and the ratios.
// --layout picks another layout the CPU's kernels read (out_in, out_in_interleaved).
//   OMP_NUM_THREADS=2 build/bench/infer/weight_stream_bench [--dtype bfloat16] [--repetitions 30] [--layout out_in]
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "machine.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// A plain parallel sum of a tensor's bytes as 64-bit words (the compiler cannot drop it: the
// caller keeps the sum).
uint64_t sum_words(const paraflow::Tensor& tensor) {
  const auto* words = static_cast<const uint64_t*>(tensor.raw());
  const int64_t count = static_cast<int64_t>(tensor.nbytes() / sizeof(uint64_t));
  uint64_t sum = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
  for (int64_t i = 0; i < count; ++i) sum += words[i];
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace paraflow;
  CLI::App app{"batch-1 decoding matmuls' weight stream against plain reads of the same bytes"};
  std::string dtype_name = "bfloat16";
  int64_t repetitions = 30;
  app.add_option("--dtype", dtype_name, "Weights and activations")->check(CLI::IsMember({"bfloat16", "float32"}));
  std::string layout_choice = "decoding";
  app.add_option("--layout", layout_choice, "The weights' layout: decoding's on this CPU, or one named")
      ->check(CLI::IsMember({"decoding", "out_in", "out_in_interleaved"}));
  app.add_option("--repetitions", repetitions, "Rounds of the three reads (medians count)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  Backend& backend = cpu_backend();
  const DType dtype = dtype_name == "float32" ? DType::f32 : DType::bf16;

  struct Product {
    int64_t out, in;
    bool gelu;
  };
  const int64_t C = 768;
  std::vector<Product> products;
  for (int layer = 0; layer < 12; ++layer) {
    products.insert(products.end(), {{3 * C, C, false}, {C, C, false}, {4 * C, C, true}, {C, 4 * C, false}});
  }
  // Small nonzero values written by this process, so that every page is its own (no shared zero
  // page) and no path could skip zeros.
  auto fill = [](const Tensor& tensor) {
    auto* bits = static_cast<uint16_t*>(tensor.raw());
    const int64_t halves = static_cast<int64_t>(tensor.nbytes() / 2);
    for (int64_t i = 0; i < halves; ++i) bits[i] = static_cast<uint16_t>(0x3c00 + i % 7);
  };
  std::vector<MatmulForward> launches;
  std::vector<Tensor> weights;
  size_t bytes = 0;
  for (const Product& p : products) {
    Tensor weight = Tensor::zeros(Shape{p.out, p.in}, dtype);
    fill(weight);
    launches.push_back(MatmulForward{.out = Tensor::zeros(Shape{1, p.out}, dtype),
                                     .inp = Tensor::zeros(Shape{1, p.in}, dtype),
                                     .weight = weight,
                                     .bias = Tensor::zeros(Shape{p.out}, DType::f32),
                                     .layout = layout_choice == "decoding"            ? backend.decoding_layout(dtype, p.in)
                                               : layout_choice == "out_in_interleaved" ? WeightLayout::out_in_interleaved
                                                                                       : WeightLayout::out_in,
                                     .gelu = p.gelu});
    weights.push_back(weight);
    bytes += weight.nbytes();
  }
  const Tensor one_buffer = Tensor::zeros(Shape{static_cast<int64_t>(bytes / 4)}, DType::f32);
  fill(one_buffer);
  for (const MatmulForward& launch : launches) backend.launch(launch);  // warm-up

  std::vector<double> one_region, per_matrix, matmul;
  uint64_t checksum = 0;
  for (int64_t round = 0; round < repetitions; ++round) {
    auto start = Clock::now();
    checksum += sum_words(one_buffer);
    one_region.push_back(seconds_since(start));
    start = Clock::now();
    for (const Tensor& weight : weights) checksum += sum_words(weight);
    per_matrix.push_back(seconds_since(start));
    start = Clock::now();
    for (const MatmulForward& launch : launches) backend.launch(launch);
    matmul.push_back(seconds_since(start));
  }
  auto rate = [&](const std::vector<double>& seconds) { return static_cast<double>(bytes) / median(seconds) / 1e9; };
  fmt::print("cpu {}\nonednn_isa {}\nthreads {}\ndtype {}\nlayout {}\nweight_mb {:.1f}\nrepetitions {}\nchecksum {}\n",
             bench::cpu_model(), cpu::onednn_isa_name(), omp_get_max_threads(), dtype_name,
             weight_layout_name(launches.front().layout), static_cast<double>(bytes) / 1e6,
             repetitions, checksum);
  fmt::print("one_region_gb_per_s {:.2f}\nper_matrix_gb_per_s {:.2f}\nmatmul_gb_per_s {:.2f}\n", rate(one_region),
             rate(per_matrix), rate(matmul));
  fmt::print("per_matrix_over_one_region {:.3f}\nmatmul_over_per_matrix {:.3f}\nmatmul_over_one_region {:.3f}\n",
             rate(per_matrix) / rate(one_region), rate(matmul) / rate(per_matrix), rate(matmul) / rate(one_region));
}
