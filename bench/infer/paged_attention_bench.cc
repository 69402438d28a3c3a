// Decoding attention over the serving engine's paged KV cache, alone: `--rows` sequences, one
// query row each (a decode step), every sequence `--context` tokens long, their blocks scattered
// over a pool per layer (`--layers` pools, taken in turn, so that the cache comes from memory as
// in a step, not from the last call's L2). Prints the cache bytes read per second (keys and values
// once each), to set against bandwidth_bench's read bandwidth.
//   OMP_NUM_THREADS=2 build/bench/infer/paged_attention_bench [--rows 32] [--context 112] [--layers 12]
//       [--n-head 12] [--head-size 64] [--kv-cache-dtype bfloat16|float32]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "machine.h"

int main(int argc, char** argv) {
  using namespace paraflow;
  CLI::App app{"paged decoding attention"};
  int64_t rows = 32, context = 112, layers = 12, n_head = 12, head_size = 64, block_size = 16, seconds = 2;
  std::string kv_dtype_name = "bfloat16";
  app.add_option("--rows", rows, "Sequences decoding (one query row each)")->check(CLI::PositiveNumber);
  app.add_option("--context", context, "Tokens each sequence attends to")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "Pools taken in turn")->check(CLI::PositiveNumber);
  app.add_option("--n-head", n_head, "Heads")->check(CLI::PositiveNumber);
  app.add_option("--head-size", head_size, "Columns per head")->check(CLI::PositiveNumber);
  app.add_option("--kv-cache-dtype", kv_dtype_name)->check(CLI::IsMember({"bfloat16", "float32"}));
  CLI11_PARSE(app, argc, argv);
  Backend& backend = cpu_backend();
  const DType kv_dtype = kv_dtype_name == "bfloat16" ? DType::bf16 : DType::f32;
  const int64_t C = n_head * head_size, blocks_per_row = (context + block_size - 1) / block_size;
  const int64_t blocks = rows * blocks_per_row;

  // Every row's blocks, drawn without repeats from the whole pool in a seeded random order.
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  Tensor positions = Tensor::zeros(Shape{rows}, DType::i32), tables = Tensor::zeros(Shape{rows, blocks_per_row}, DType::i32);
  std::fill_n(positions.data<int32_t>(), rows, static_cast<int32_t>(context - 1));
  std::copy(order.begin(), order.end(), tables.data<int32_t>());
  std::vector<Tensor> k_pools, v_pools;
  for (int64_t layer = 0; layer < layers; ++layer) {
    k_pools.push_back(Tensor::zeros(Shape{blocks, n_head, block_size, head_size}, kv_dtype));
    v_pools.push_back(Tensor::zeros(Shape{blocks, n_head, block_size, head_size}, kv_dtype));
  }
  Tensor qkv = Tensor::zeros(Shape{rows, 1, 3 * C}, DType::f32), out = Tensor::zeros(Shape{rows, 1, C}, DType::f32);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<float>()[i] = normal(rng);
  auto step = [&](int64_t layer) {
    backend.launch(AttentionPagedForward{.out = out, .qkv = qkv, .k_pool = k_pools[static_cast<size_t>(layer)],
                                         .v_pool = v_pools[static_cast<size_t>(layer)], .positions = positions,
                                         .block_tables = tables, .n_head = n_head, .scale = 0.125f});
  };
  for (int64_t layer = 0; layer < layers; ++layer) step(layer);  // warm-up: page faults, buffers

  int64_t calls = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < static_cast<double>(seconds)) {
    step(calls % layers);
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double bytes = static_cast<double>(2 * rows * context * C * dtype_size(kv_dtype));
  fmt::print("cpu {}\nonednn_isa {}\nrows {}\ncontext {}\nn_head {}\nhead_size {}\nkv_cache_dtype {}\nlayers {}\n",
             bench::cpu_model(), cpu::onednn_isa_name(), rows, context, n_head, head_size, kv_dtype_name, layers);
  fmt::print("us_per_call {:.1f}\ncache_gb_per_s {:.2f}\n", 1e6 * elapsed / static_cast<double>(calls),
             bytes * static_cast<double>(calls) / elapsed / 1e9);
}
