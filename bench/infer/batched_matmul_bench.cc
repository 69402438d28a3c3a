// The serving engine's matmul at decoding batch sizes: the row-invariant kernel (each row's
// arithmetic independent of the batch; serving's determinism) on each weight layout it reads
// ([out, in] rows, out_in_interleaved, and out_in_tiles where the CPU has AMX), against oneDNN's
// GEMM (AMX or AVX512 as oneDNN picks; its blocking, and so its rounding, changes with the rows)
// on one weight matrix, f32 out. Prints per row count the GMAC/s of each and the ratio of the
// layout serving uses (the backend's preference) to oneDNN, per second of wall time and per
// second of this process's CPU time (the steadier figure on a machine shared with other work).
// With --dtype float16: f32 rows times float16 weights (half arithmetic where the CPU has
// AVX512_FP16), against the f32 GEMM on the same weights in f32. With --dtype q8_0 or q4_k: f32
// rows times block-quantized weights ([out, in] rows, and out_in_tiles where the CPU has
// AVX512_VNNI), against the bf16 weights' row-invariant kernel in the layout serving stores them
// (what a bf16 server runs; there is no quantized GEMM in oneDNN to compare with).
//   OMP_NUM_THREADS=2 build/bench/infer/batched_matmul_bench [--dtype bfloat16|float32|float16|q8_0|q4_k]
//       [--in 768] [--out 3072] [--rows 1,4,8,16,32,64]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <ctime>
#include <fstream>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "machine.h"

namespace {

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

struct Rate {
  double wall, cpu;  // GMAC per second of each
};

}  // namespace

int main(int argc, char** argv) {
  using namespace paraflow;
  CLI::App app{"row-invariant matmul vs oneDNN at decoding batch sizes"};
  int64_t in = 768, out = 3072, seconds_per_case = 1;
  std::vector<int64_t> rows{1, 4, 8, 16, 32, 64};
  std::string dtype_name = "bfloat16";
  app.add_option("--dtype", dtype_name,
                 "Weights and inputs: bfloat16 or float32 (oneDNN's sgemm the reference), or float16 weights and f32 inputs")
      ->check(CLI::IsMember({"bfloat16", "float32", "float16", "q8_0", "q4_k"}));
  app.add_option("--in", in, "Input features");
  app.add_option("--out", out, "Output features");
  app.add_option("--rows", rows, "Row counts")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  Backend& backend = cpu_backend();
  const DType dtype = parse_dtype(dtype_name == "float32"    ? "f32"
                                  : dtype_name == "float16"  ? "f16"
                                  : dtype_name == "bfloat16" ? "bf16"
                                                             : dtype_name,
                                  "--dtype");
  const bool quantized = is_block_quantized(dtype);
  const DType input_dtype = dtype == DType::f16 || quantized ? DType::f32 : dtype;
  fmt::print("cpu {}\nonednn_isa {}\nshape {}x{} {} weights [out, in]\n", bench::cpu_model(), cpu::onednn_isa_name(), in, out,
             dtype_name);
  if (dtype == DType::bf16 && !cpu::has_native_bf16()) {
    fmt::print("no bf16 arithmetic on this CPU: the onednn column runs the few-rows kernel too\n");
  }
  // The layout decoding stores these weights in (out_in: [out, in] rows, as they are).
  const WeightLayout decoding = backend.decoding_layout(dtype, in);
  const bool tiles = decoding == WeightLayout::out_in_tiles;
  // The comparison: quantized weights against bf16 ones as serving stores them, others against oneDNN.
  const WeightLayout bf16_decoding = backend.decoding_layout(DType::bf16, in);
  fmt::print("decoding stores these weights {}\nGMAC/s per second of wall / cpu time\n{:>6} {:>22} {:>22} {:>22} {:>22} {:>8}\n",
             weight_layout_name(decoding), "rows", "row_invariant out_in", "row_invariant inter.",
             tiles ? "row_invariant tiles" : "(no tiles here)",
             quantized ? fmt::format("bf16 {}", weight_layout_name(bf16_decoding)) : "onednn", "ratio");
  Tensor weight = Tensor::zeros(Shape{out, in}, dtype);
  // The GEMM's weights: float16 ones have no GEMM, so the f32 one multiplies an f32 copy.
  Tensor library_weight = dtype == DType::f16 ? Tensor::zeros(Shape{out, in}, DType::f32)
                          : quantized         ? Tensor::zeros(Shape{out, in}, DType::bf16)
                                              : weight;
  Tensor bias = Tensor::zeros(Shape{out}, DType::f32);
  for (int64_t n : rows) {
    Tensor x = Tensor::zeros(Shape{n, in}, input_dtype), y = Tensor::zeros(Shape{n, out}, DType::f32);
    Tensor bf16_x = Tensor::zeros(Shape{n, in}, DType::bf16);
    auto rate = [&](WeightLayout layout, bool row_invariant) {
      // The comparison's call (row_invariant false): oneDNN's GEMM, or for quantized weights the bf16 kernel.
      const bool library = !row_invariant;
      MatmulForward args{.out = y, .inp = library && quantized ? bf16_x : x, .weight = library ? library_weight : weight,
                         .bias = bias, .layout = layout, .row_invariant = row_invariant || quantized};
      backend.launch(args);
      int64_t calls = 0;
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = cpu_seconds();
      double elapsed = 0;
      while (elapsed < static_cast<double>(seconds_per_case)) {
        backend.launch(args);
        ++calls;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      const double gmac = static_cast<double>(calls * n * in * out) / 1e9;
      return Rate{gmac / elapsed, gmac / (cpu_seconds() - cpu_start)};
    };
    const Rate rows_rate = rate(WeightLayout::out_in, true), library = rate(quantized ? bf16_decoding : WeightLayout::out_in, false);
    const Rate interleaved = quantized ? Rate{0, 0} : rate(WeightLayout::out_in_interleaved, true);
    const Rate tiled = tiles ? rate(WeightLayout::out_in_tiles, true) : Rate{0, 0};
    const Rate& serving = decoding == WeightLayout::out_in_tiles         ? tiled
                          : decoding == WeightLayout::out_in_interleaved ? interleaved
                                                                         : rows_rate;
    fmt::print("{:>6} {:>14.1f} / {:>5.1f} {:>14.1f} / {:>5.1f} {:>14.1f} / {:>5.1f} {:>14.1f} / {:>5.1f} {:>8.2f}\n", n,
               rows_rate.wall, rows_rate.cpu, interleaved.wall, interleaved.cpu, tiled.wall, tiled.cpu, library.wall,
               library.cpu, serving.cpu / library.cpu);
  }
}
