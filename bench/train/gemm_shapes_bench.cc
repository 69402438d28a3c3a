// The f32 GEMMs of one training step of a GPT config, as its linear layers ([in, out] weights) and
// its tied lm_head ([vocab, C]) issue them: forward, input gradient and weight gradient. Each is
// timed in oneDNN's sgemm, OpenBLAS and oneDNN's matmul primitive, taking turns, and the engine
// paraflow's sgemm picks by the product's shape (cpu::engine_for_shape) is marked. The last lines
// add up one step's GEMM time with the engine by shape, with each engine alone and with the
// fastest one for every product: what the rule gains and what it leaves on this CPU. Operands are
// reused between repeats (warm in cache), which flatters every engine alike.
//   OMP_NUM_THREADS=2 build/bench/train/gemm_shapes_bench [--n-layer 6 --n-embd 384 --n-ctx 256
//       --batch 8 --vocab 8192] [--seconds 0.5]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "machine.h"

using namespace paraflow;

namespace {

struct Product {
  std::string name;
  bool trans_a, trans_b;
  int64_t M, N, K, count;  // count: how many of it a step runs
  double flops() const { return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K); }
};

// A linear layer of `rows` inputs, [in, out] weight (matmul.cc's calls): out = x·W, dx = dout·W^T,
// dW = x^T·dout.
void add_linear(std::vector<Product>& products, const std::string& name, int64_t rows, int64_t in, int64_t out,
                int64_t count) {
  products.push_back({name + " forward", false, false, rows, out, in, count});
  products.push_back({name + " dx", false, true, rows, in, out, count});
  products.push_back({name + " dW", true, false, in, out, rows, count});
}

// The tied lm_head, [vocab, C] weight: logits = x·W^T, dx = dlogits·W, dW = dlogits^T·x.
void add_head(std::vector<Product>& products, int64_t rows, int64_t C, int64_t vocab) {
  products.push_back({"lm_head forward", false, true, rows, vocab, C, 1});
  products.push_back({"lm_head dx", false, false, rows, C, vocab, 1});
  products.push_back({"lm_head dW", true, false, vocab, C, rows, 1});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"paraflow's f32 training GEMMs through each engine"};
  int64_t layers = 6, embd = 384, context = 256, batch = 8, vocab = 8192;
  double seconds = 0.5;
  app.add_option("--n-layer", layers);
  app.add_option("--n-embd", embd);
  app.add_option("--n-ctx", context);
  app.add_option("--batch", batch);
  app.add_option("--vocab", vocab);
  app.add_option("--seconds", seconds, "Time per product and engine");
  CLI11_PARSE(app, argc, argv);
  fmt::print("cpu {}\nonednn_isa {}\nopenblas_core {}\n", bench::cpu_model(), cpu::onednn_isa_name(), cpu::openblas_core_name());

  const int64_t rows = batch * context;
  std::vector<Product> products;
  add_linear(products, "qkv", rows, embd, 3 * embd, layers);
  add_linear(products, "proj", rows, embd, embd, layers);
  add_linear(products, "fc", rows, embd, 4 * embd, layers);
  add_linear(products, "fc_proj", rows, 4 * embd, embd, layers);
  add_head(products, rows, embd, vocab);

  int64_t largest = 0;
  for (const Product& p : products) largest = std::max({largest, p.M * p.K, p.K * p.N, p.M * p.N});
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(largest)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = uniform(rng), b[i] = uniform(rng);

  const std::vector<cpu::GemmEngine> engines{cpu::GemmEngine::onednn, cpu::GemmEngine::openblas,
                                            cpu::GemmEngine::onednn_matmul};
  const size_t count = engines.size();
  auto seconds_per_call = [&](cpu::GemmEngine engine, const Product& p) {
    // Row-major leading dimensions of op(A) (M,K) and op(B) (K,N) as stored.
    const int64_t lda = p.trans_a ? p.M : p.K, ldb = p.trans_b ? p.K : p.N;
    cpu::set_gemm_engine(engine);
    auto run = [&] {
      cpu::sgemm(p.trans_a, p.trans_b, p.M, p.N, p.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), p.N);
    };
    run();  // warm-up
    int64_t calls = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (calls < 3 || elapsed < seconds) {
      run();
      ++calls;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return elapsed / static_cast<double>(calls);
  };

  fmt::print("GFLOP/s\n{:<17} {:>6} {:>6} {:>6}", "product", "M", "N", "K");
  for (cpu::GemmEngine engine : engines) fmt::print(" {:>13}", cpu::gemm_engine_name(engine));
  fmt::print(" {:>13}\n", "by_shape");
  std::vector<double> step(count, 0.0);
  double by_shape = 0, fastest = 0;
  for (const Product& p : products) {
    std::vector<double> time(count);
    for (size_t e = 0; e < count; ++e) time[e] = seconds_per_call(engines[e], p);
    const cpu::GemmEngine chosen = cpu::engine_for_shape(p.trans_a, p.trans_b, p.M, p.N, p.K);
    fmt::print("{:<17} {:>6} {:>6} {:>6}", p.name, p.M, p.N, p.K);
    for (double seconds_per : time) fmt::print(" {:>13.1f}", p.flops() / seconds_per / 1e9);
    fmt::print(" {:>13}\n", cpu::gemm_engine_name(chosen));
    const double repeats = static_cast<double>(p.count);
    for (size_t e = 0; e < count; ++e) step[e] += repeats * time[e];
    by_shape += repeats * time[static_cast<size_t>(std::find(engines.begin(), engines.end(), chosen) - engines.begin())];
    fastest += repeats * *std::min_element(time.begin(), time.end());
  }
  fmt::print("step_gemm_ms_by_shape {:.1f}\n", 1000 * by_shape);
  for (size_t e = 0; e < count; ++e) {
    fmt::print("step_gemm_ms_{} {:.1f}\n", cpu::gemm_engine_name(engines[e]), 1000 * step[e]);
  }
  fmt::print("step_gemm_ms_fastest_each {:.1f}\n", 1000 * fastest);
  fmt::print("by_shape_vs_onednn {:.3f}\nby_shape_vs_fastest_each {:.3f}\n", step[0] / by_shape, fastest / by_shape);
}
