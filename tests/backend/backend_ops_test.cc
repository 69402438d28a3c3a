// Every kernel of every backend other than the CPU's, forward and backward, each dtype, against
// the CPU backend (as ggml's test-backend-ops): each case builds the same random inputs on both
// backends, runs the kernel on each, and compares every output by the norm of the difference,
// relative to the norm of the CPU's output, against a bound from the dtype's epsilon and the
// length of the sums behind each value. A case whose kernel the device lacks fails, and so does a
// kernel the device registers that no case runs.
//
// Where no such backend exists (no GPU) nothing is checked: the program lists the cases it did not
// run and exits kNotRun, which CTest reports as "Not Run" (SKIP_RETURN_CODE), never as passed.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/opaque_backend.h"

namespace paraflow {
namespace {

constexpr int kNotRun = 77;

using Values = std::vector<double>;

// A case's named outputs, read back as doubles.
struct Output {
  std::string name;
  Values values;
  int64_t sum_length;  // the longest sum behind one value (the bound grows as its square root)
  DType dtype;         // the type the value is stored or computed in
};

// Builds inputs in one backend's memory from a seeded generator: two backends given the same seed
// get the same values. Where the CPU has no bf16 kernel for a case (its bf16 GEMMs exist only where
// they beat f32 ones), its reference runs widened: bf16 tensors become f32 ones holding the same
// bf16-rounded values.
class Inputs {
 public:
  Inputs(Backend& backend, uint64_t seed, bool widen_bf16 = false)
      : backend_(backend), rng_(seed), widen_bf16_(widen_bf16) {}
  Backend& backend() { return backend_; }
  Tensor empty(Shape shape, DType dtype) { return backend_.empty(std::move(shape), stored(dtype)); }

  Tensor random(Shape shape, DType dtype = DType::f32, double scale = 1.0) {
    std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
    std::vector<float> values(static_cast<size_t>(shape.numel()));
    for (float& value : values) value = normal(rng_);
    return put(values, std::move(shape), dtype);
  }
  Tensor put(const std::vector<float>& values, Shape shape, DType dtype) {
    if (dtype == DType::f32) return backend_.upload(values, std::move(shape), DType::f32);
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    if (!widen_bf16_) return backend_.upload(bits, std::move(shape), DType::bf16);
    std::vector<float> rounded(values.size());
    for (size_t i = 0; i < values.size(); ++i) rounded[i] = bf16_to_f32(bits[i]);
    return backend_.upload(rounded, std::move(shape), DType::f32);
  }
  // The same values 64 bytes into a larger buffer, where the memory planner's arena may place a
  // tensor (a GEMM library may assume more alignment than that).
  Tensor at_64_bytes(const Tensor& tensor) {
    Tensor buffer = backend_.empty({static_cast<int64_t>(tensor.nbytes() + 64) / 2}, DType::u16);
    Tensor view = buffer.view(64, tensor.shape(), tensor.dtype());
    backend_.copy(tensor, view);
    return view;
  }
  Tensor positive(Shape shape) {  // Adam's second moments
    std::uniform_real_distribution<float> uniform(0.01f, 1.0f);
    std::vector<float> values(static_cast<size_t>(shape.numel()));
    for (float& value : values) value = uniform(rng_);
    return put(values, std::move(shape), DType::f32);
  }
  // Integers in [low, high), every `ignore_every`-th one -1 (an ignored target) when asked.
  Tensor ints(Shape shape, int32_t low, int32_t high, int64_t ignore_every = 0) {
    std::uniform_int_distribution<int32_t> uniform(low, high - 1);
    std::vector<int32_t> values(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = ignore_every > 0 && i % ignore_every == 1 ? -1 : uniform(rng_);
    }
    return backend_.upload(values, std::move(shape), DType::i32);
  }
  Values read(const Tensor& tensor) {
    Values values;
    if (tensor.dtype() == DType::bf16) {
      for (uint16_t bits : backend_.download<uint16_t>(tensor)) values.push_back(bf16_to_f32(bits));
    } else {
      for (float value : backend_.download<float>(tensor)) values.push_back(value);
    }
    return values;
  }

 private:
  DType stored(DType dtype) const { return widen_bf16_ && dtype == DType::bf16 ? DType::f32 : dtype; }
  Backend& backend_;
  std::mt19937_64 rng_;
  bool widen_bf16_;
};

struct Case {
  std::string name;  // op, dtype and variant
  KernelOp op;
  DType dtype;
  std::function<std::vector<Output>(Inputs&)> run;
};

// Awkward sizes on purpose (rows not a multiple of anything); GEMM widths multiples of 8, which
// cuBLASLt's tensor-core algorithms want for bf16.
constexpr int64_t kRows = 37, kIn = 64, kOut = 96, kVocab = 203, kB = 2, kT = 29;

std::vector<Case> matmul_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
      for (bool gelu : {false, true}) {
        const std::string variant = fmt::format("{}/{}/{}", dtype_name(dtype), weight_layout_name(layout),
                                                gelu ? "bias+gelu" : "bias");
        const Shape weight_shape = layout == WeightLayout::in_out ? Shape{kIn, kOut} : Shape{kOut, kIn};
        cases.push_back({"matmul_forward " + variant, KernelOp::matmul_forward, dtype, [=](Inputs& in) {
                           Tensor out = in.at_64_bytes(in.empty({kRows, kOut}, dtype));
                           Tensor slope = gelu ? in.empty({kRows, kOut}, dtype) : Tensor{};
                           in.backend().launch(MatmulForward{.out = out, .gelu_slope = slope,
                                                             .inp = in.at_64_bytes(in.random({kRows, kIn}, dtype)),
                                                             .weight = in.random(weight_shape, dtype, 0.2),
                                                             .bias = in.random({kOut}), .layout = layout, .gelu = gelu});
                           std::vector<Output> outputs{{"out", in.read(out), kIn, dtype}};
                           if (gelu) outputs.push_back({"gelu_slope", in.read(slope), kIn, dtype});
                           return outputs;
                         }});
        cases.push_back({"matmul_backward " + variant, KernelOp::matmul_backward, dtype, [=](Inputs& in) {
                           Tensor inp = in.random({kRows, kIn}, dtype), weight = in.random(weight_shape, dtype, 0.2);
                           // dout and the slope share out's type: the operands' with GELU, f32 without
                           // (both paths of a bf16 backward: its dout used as it is, or a bf16 copy made).
                           const DType out_type = gelu ? dtype : DType::f32;
                           Tensor dout = in.random({kRows, kOut}, out_type);
                           Tensor slope = gelu ? in.random({kRows, kOut}, out_type) : Tensor{};
                           Tensor dinp = in.at_64_bytes(in.random({kRows, kIn}, dtype));
                           Tensor dweight = in.random(weight_shape, dtype);
                           Tensor dbias = in.random({kOut});
                           in.backend().launch(MatmulBackward{.dinp = dinp, .dweight = dweight, .dbias = dbias,
                                                              .dout = dout, .inp = inp, .weight = weight,
                                                              .gelu_slope = slope, .layout = layout, .gelu = gelu,
                                                              .accumulate_dinp = true, .accumulate_dweight = true});
                           return std::vector<Output>{{"dinp", in.read(dinp), kOut, dtype},
                                                      {"dweight", in.read(dweight), kRows, dtype},
                                                      {"dbias", in.read(dbias), kRows, DType::f32}};
                         }});
      }
    }
  }
  return cases;
}

std::vector<Case> storage_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string type = dtype_name(dtype);
    cases.push_back({"layernorm_forward " + type, KernelOp::layernorm_forward, dtype, [=](Inputs& in) {
                       Tensor out = in.empty({kRows, kOut}, dtype);
                       Tensor mean = in.empty({kRows}, DType::f32), rstd = in.empty({kRows}, DType::f32);
                       in.backend().launch(LayernormForward{.out = out, .mean = mean, .rstd = rstd,
                                                            .inp = in.random({kRows, kOut}, dtype, 3.0),
                                                            .weight = in.random({kOut}), .bias = in.random({kOut})});
                       return std::vector<Output>{{"out", in.read(out), kOut, dtype},
                                                  {"mean", in.read(mean), kOut, DType::f32},
                                                  {"rstd", in.read(rstd), kOut, DType::f32}};
                     }});
    cases.push_back({"layernorm_backward " + type, KernelOp::layernorm_backward, dtype, [=](Inputs& in) {
                       Tensor dinp = in.random({kRows, kOut}, dtype), dweight = in.random({kOut}), dbias = in.random({kOut});
                       in.backend().launch(LayernormBackward{.dinp = dinp, .dweight = dweight, .dbias = dbias,
                                                             .dout = in.random({kRows, kOut}, dtype),
                                                             .inp = in.random({kRows, kOut}, dtype),
                                                             .weight = in.random({kOut}), .mean = in.random({kRows}, DType::f32, 0.1),
                                                             .rstd = in.positive({kRows}), .accumulate_dinp = true});
                       return std::vector<Output>{{"dinp", in.read(dinp), kOut, dtype},
                                                  {"dweight", in.read(dweight), kRows, DType::f32},
                                                  {"dbias", in.read(dbias), kRows, DType::f32}};
                     }});
    cases.push_back({"add_forward " + type, KernelOp::add_forward, dtype, [=](Inputs& in) {
                       Tensor out = in.empty({kRows, kOut}, dtype);
                       in.backend().launch(AddForward{.out = out, .a = in.random({kRows, kOut}, dtype),
                                                      .b = in.random({kRows, kOut}, dtype)});
                       return std::vector<Output>{{"out", in.read(out), 2, dtype}};
                     }});
    cases.push_back({"add_backward " + type, KernelOp::add_backward, dtype, [=](Inputs& in) {
                       Tensor da = in.random({kRows, kOut}, dtype), db = in.random({kRows, kOut}, dtype);
                       in.backend().launch(AddBackward{.da = da, .db = db, .dout = in.random({kRows, kOut}, dtype),
                                                       .accumulate_a = true, .accumulate_b = false});
                       return std::vector<Output>{{"da", in.read(da), 2, dtype}, {"db", in.read(db), 1, dtype}};
                     }});
    const DType other = dtype == DType::f32 ? DType::bf16 : DType::f32;
    cases.push_back({fmt::format("cast {}->{} accumulate", type, dtype_name(other)), KernelOp::cast, dtype,
                     [=](Inputs& in) {
                       Tensor dst = in.random({kRows, kOut}, other);
                       in.backend().launch(Cast{.src = in.random({kRows, kOut}, dtype), .dst = dst, .accumulate = true});
                       return std::vector<Output>{{"dst", in.read(dst), 2, other}};
                     }});
    // GPT-2's attention (n_kv_head 0: as many as the query heads) and a grouped-query one.
    for (int64_t kv_heads : {0, 2}) {
      constexpr int64_t kHeads = 4, kHeadSize = 32;
      const int64_t kv = kv_heads == 0 ? kHeads : kv_heads, width = (kHeads + 2 * kv) * kHeadSize;
      const std::string variant = fmt::format("{}/kv_heads {}", type, kv);
      const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
      cases.push_back({"attention_forward " + variant, KernelOp::attention_forward, dtype, [=](Inputs& in) {
                         Tensor out = in.empty({kB, kT, kHeads * kHeadSize}, dtype);
                         Tensor logsumexp = in.empty({kB, kHeads, kT}, DType::f32);
                         in.backend().launch(AttentionForward{.out = out, .logsumexp = logsumexp,
                                                              .qkv = in.random({kB, kT, width}, dtype),
                                                              .n_head = kHeads, .n_kv_head = kv_heads, .scale = scale});
                         return std::vector<Output>{{"out", in.read(out), kT * kHeadSize, dtype},
                                                    {"logsumexp", in.read(logsumexp), kT * kHeadSize, DType::f32}};
                       }});
      cases.push_back({"attention_backward " + variant, KernelOp::attention_backward, dtype, [=](Inputs& in) {
                         // logsumexp from the backend's own forward pass: backward's probabilities must sum to one.
                         Tensor qkv = in.random({kB, kT, width}, dtype);
                         Tensor out = in.empty({kB, kT, kHeads * kHeadSize}, dtype);
                         Tensor logsumexp = in.empty({kB, kHeads, kT}, DType::f32);
                         in.backend().launch(AttentionForward{.out = out, .logsumexp = logsumexp, .qkv = qkv,
                                                              .n_head = kHeads, .n_kv_head = kv_heads, .scale = scale});
                         Tensor dqkv = in.random({kB, kT, width}, dtype);
                         in.backend().launch(AttentionBackward{.dqkv = dqkv,
                                                               .dout = in.random({kB, kT, kHeads * kHeadSize}, dtype),
                                                               .qkv = qkv, .logsumexp = logsumexp, .n_head = kHeads,
                                                               .n_kv_head = kv_heads, .scale = scale,
                                                               .accumulate_dqkv = true});
                         return std::vector<Output>{{"dqkv", in.read(dqkv), kT * kHeadSize * kHeads, dtype}};
                       }});
    }
  }
  return cases;
}

std::vector<Case> f32_cases() {
  std::vector<Case> cases;
  cases.push_back({"embedding_forward f32", KernelOp::embedding_forward, DType::f32, [](Inputs& in) {
                     Tensor out = in.empty({kB * kT, kIn}, DType::f32);
                     in.backend().launch(EmbeddingForward{.out = out, .tokens = in.ints({kB, kT}, 0, kVocab),
                                                          .wte = in.random({kVocab, kIn}), .wpe = in.random({kT + 5, kIn}),
                                                          .position0 = 3});
                     return std::vector<Output>{{"out", in.read(out), 2, DType::f32}};
                   }});
  cases.push_back({"embedding_backward f32", KernelOp::embedding_backward, DType::f32, [](Inputs& in) {
                     // A small vocabulary, so that tokens repeat and their gradients add up.
                     Tensor dwte = in.random({11, kIn}), dwpe = in.random({kT, kIn});
                     in.backend().launch(EmbeddingBackward{.dwte = dwte, .dwpe = dwpe, .dout = in.random({kB * kT, kIn}),
                                                           .tokens = in.ints({kB, kT}, 0, 11)});
                     return std::vector<Output>{{"dwte", in.read(dwte), kB * kT, DType::f32},
                                                {"dwpe", in.read(dwpe), kB, DType::f32}};
                   }});
  cases.push_back({"softmax_xent_forward f32", KernelOp::softmax_xent_forward, DType::f32, [](Inputs& in) {
                     Tensor losses = in.empty({kRows}, DType::f32), stats = in.empty({kRows, 2}, DType::f32);
                     in.backend().launch(SoftmaxXentForward{.losses = losses, .stats = stats,
                                                            .logits = in.random({kRows, kVocab}, DType::f32, 4.0),
                                                            .targets = in.ints({kRows}, 0, kVocab, 5)});
                     return std::vector<Output>{{"losses", in.read(losses), kVocab, DType::f32},
                                                {"stats", in.read(stats), kVocab, DType::f32}};
                   }});
  cases.push_back({"softmax_xent_backward f32", KernelOp::softmax_xent_backward, DType::f32, [](Inputs& in) {
                     Tensor logits = in.random({kRows, kVocab}, DType::f32, 4.0), targets = in.ints({kRows}, 0, kVocab, 5);
                     Tensor losses = in.empty({kRows}, DType::f32), stats = in.empty({kRows, 2}, DType::f32);
                     in.backend().launch(SoftmaxXentForward{.losses = losses, .stats = stats, .logits = logits, .targets = targets});
                     Tensor dlogits = in.random({kRows, kVocab});
                     in.backend().launch(SoftmaxXentBackward{.dlogits = dlogits, .logits = logits, .stats = stats,
                                                             .targets = targets, .dlosses = in.random({kRows}),
                                                             .accumulate = true});
                     return std::vector<Output>{{"dlogits", in.read(dlogits), kVocab, DType::f32}};
                   }});
  cases.push_back({"adamw_update f32 (+bf16 copy)", KernelOp::adamw_update, DType::f32, [](Inputs& in) {
                     const int64_t n = 1000;
                     Tensor param = in.random({n}), m = in.random({n}, DType::f32, 0.1), v = in.positive({n});
                     Tensor copy = in.empty({n}, DType::bf16);
                     in.backend().launch(AdamWUpdate{.param = param, .grad = in.random({n}), .m = m, .v = v,
                                                     .param_copy = copy,
                                                     .params = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                                                .weight_decay = 0.1f, .step = 3, .grad_scale = 0.5f}});
                     return std::vector<Output>{{"param", in.read(param), 8, DType::f32},
                                                {"m", in.read(m), 2, DType::f32},
                                                {"v", in.read(v), 2, DType::f32},
                                                {"param_copy", in.read(copy), 8, DType::bf16}};
                   }});
  cases.push_back({"sum_squares f32", KernelOp::sum_squares, DType::f32, [](Inputs& in) {
                     const int64_t n = 100003;  // more than the blocks' total of threads, not a multiple of it
                     double sum = 0.0;
                     in.backend().launch(SumSquares{.x = in.random({n}), .result = &sum});
                     return std::vector<Output>{{"sum", {sum}, n, DType::f64}};
                   }});
  return cases;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases = matmul_cases();
  for (auto* more : {&storage_cases, &f32_cases}) {
    for (Case& c : more()) cases.push_back(std::move(c));
  }
  return cases;
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::f64: return std::ldexp(1.0, -53);
    default: return std::ldexp(1.0, -24);
  }
}

// |device - cpu|₂ <= (4 u_out + 4 u_bf16 [a bf16 case] + 64 u_f32 √(sum length)) |cpu|₂: each side
// rounds an output once to its type (u_out); a bf16 case may round an intermediate to bf16 on one
// side where the other keeps f32 (the CPU's widened reference); f32 sums run in different orders,
// their errors growing as the square root of the length when independent, and the CPU's exp and
// tanh are approximations to a few f32 ulps. An output is also wrong if the two sides' NaNs or
// infinities differ. (Never calibrated on a GPU: the first run there may show these too tight.)
std::string compare(const Output& cpu, const Output& device, DType case_dtype) {
  if (cpu.values.size() != device.values.size()) {
    return fmt::format("{}: {} values on the CPU, {} on the device", cpu.name, cpu.values.size(), device.values.size());
  }
  double difference = 0.0, norm = 0.0;
  size_t worst = 0;
  double worst_error = -1.0;
  for (size_t i = 0; i < cpu.values.size(); ++i) {
    const double a = cpu.values[i], b = device.values[i];
    if (std::isfinite(a) != std::isfinite(b)) return fmt::format("{}[{}]: {} on the CPU, {} on the device", cpu.name, i, a, b);
    difference += (a - b) * (a - b);
    norm += a * a;
    if (std::abs(a - b) > worst_error) worst_error = std::abs(a - b), worst = i;
  }
  const double relative = 4.0 * unit_roundoff(cpu.dtype) + (case_dtype == DType::bf16 ? 4.0 * unit_roundoff(DType::bf16) : 0.0) +
                          64.0 * unit_roundoff(DType::f32) * std::sqrt(static_cast<double>(cpu.sum_length));
  const double bound = relative * std::sqrt(norm) + 1e-30;
  if (std::sqrt(difference) <= bound) return "";
  return fmt::format("{}: |difference| {:.3g} > bound {:.3g} (|cpu| {:.3g}); worst [{}]: cpu {} device {}", cpu.name,
                     std::sqrt(difference), bound, std::sqrt(norm), worst, cpu.values[worst], device.values[worst]);
}

// The harness checked on itself, where no GPU is needed: every case runs on the CPU backend and on
// the opaque test backend (the CPU's kernels behind memory the host cannot touch), so each case
// must build valid arguments and read its outputs back; the two must agree, and every output
// pushed 10% off must be rejected by compare().
int self_check(const std::vector<Case>& cases) {
  int failed = 0;
  const uint64_t seed = std::random_device{}();
  for (const Case& c : cases) {
    std::string problem;
    try {
      const bool widen = !cpu_backend().supports(c.op, c.dtype);
      Inputs on_cpu(cpu_backend(), seed, widen), on_opaque(testing::opaque_backend(), seed, widen);
      const std::vector<Output> expected = c.run(on_cpu), actual = c.run(on_opaque);
      if (expected.size() != actual.size()) problem = "different outputs on the two backends";
      for (size_t i = 0; i < expected.size() && problem.empty(); ++i) {
        problem = compare(expected[i], actual[i], c.dtype);
        Output pushed = actual[i];
        for (double& value : pushed.values) value *= 1.1;
        if (problem.empty() && compare(expected[i], pushed, c.dtype).empty()) {
          problem = pushed.name + ": 10% off passed the comparison";
        }
      }
    } catch (const std::exception& error) {
      problem = fmt::format("threw: {}", error.what());
    }
    std::printf("  %s  %s%s%s\n", problem.empty() ? "ok    " : "FAILED", c.name.c_str(), problem.empty() ? "" : ": ",
                problem.c_str());
    failed += problem.empty() ? 0 : 1;
  }
  std::printf("backend_ops_test --self-check: %zu cases, %d failed (seed %llu)\n", cases.size(), failed,
              static_cast<unsigned long long>(seed));
  return failed == 0 ? 0 : 1;
}

int run(bool check_harness) {
  const std::vector<Case> cases = all_cases();
  if (check_harness) return self_check(cases);
  std::vector<Backend*> devices;
  for (Backend* backend : available_backends()) {
    if (backend->device().kind != DeviceKind::cpu) devices.push_back(backend);
  }
  if (devices.empty()) {
    std::printf("backend_ops_test: NOT RUN: no backend other than the CPU is present (no GPU, or a build without "
                "nvcc). These %zu cases were not checked on any device:\n", cases.size());
    for (const Case& c : cases) std::printf("  not checked: %s\n", c.name.c_str());
    return kNotRun;
  }
  int failed = 0, passed = 0, missing = 0;
  const uint64_t seed = std::random_device{}();
  std::printf("backend_ops_test: seed %llu\n", static_cast<unsigned long long>(seed));
  for (Backend* device : devices) {
    std::printf("backend %s against %s\n", device->describe().c_str(), cpu_backend().describe().c_str());
    for (const Case& c : cases) {
      if (!device->supports(c.op, c.dtype)) {
        std::printf("  NOT REGISTERED  %s\n", c.name.c_str());
        ++missing;
        continue;
      }
      std::string problem;
      try {
        const bool widen = !cpu_backend().supports(c.op, c.dtype);
        Inputs on_cpu(cpu_backend(), seed, widen), on_device(*device, seed);
        const std::vector<Output> expected = c.run(on_cpu), actual = c.run(on_device);
        for (size_t i = 0; i < expected.size() && problem.empty(); ++i) problem = compare(expected[i], actual[i], c.dtype);
      } catch (const std::exception& error) {
        problem = fmt::format("threw: {}", error.what());
      }
      std::printf("  %s  %s%s%s\n", problem.empty() ? "ok    " : "FAILED", c.name.c_str(), problem.empty() ? "" : ": ",
                  problem.c_str());
      (problem.empty() ? passed : failed) += 1;
    }
  }
  // A kernel the device registers that no case runs would go unchecked: each one fails the run.
  int unchecked = 0;
#define PARAFLOW_KERNEL_OP(name) KernelOp::name,
  const KernelOp every_op[] = {PARAFLOW_KERNELS(PARAFLOW_KERNEL_OP)};
#undef PARAFLOW_KERNEL_OP
  for (Backend* device : devices) {
    for (KernelOp op : every_op) {
      for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::q8_0, DType::q4_k}) {
        if (!device->supports(op, dtype)) continue;
        bool covered = false;
        for (const Case& c : cases) covered = covered || (c.op == op && c.dtype == dtype);
        if (covered) continue;
        std::printf("  NO CASE  %s %s is registered on %s and checked by no case\n", kernel_op_name(op), dtype_name(dtype),
                    device->name().c_str());
        ++unchecked;
      }
    }
  }
  std::printf("backend_ops_test: %d passed, %d failed, %d not registered, %d registered without a case\n", passed,
              failed, missing, unchecked);
  return failed == 0 && missing == 0 && unchecked == 0 ? 0 : 1;
}

}  // namespace
}  // namespace paraflow

// --self-check: the harness on itself (CPU against the opaque backend), runnable anywhere.
int main(int argc, char** argv) {
  const bool check_harness = argc > 1 && std::string(argv[1]) == "--self-check";
  if (argc > 1 && !check_harness) {
    std::fprintf(stderr, "usage: backend_ops_test [--self-check]\n");
    return 2;
  }
  return paraflow::run(check_harness);
}
