// Every op kernel, on every backend present and on the opaque test backend (memory the host
// cannot touch), against the float64 references on random inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <tuple>
#include <utility>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/half_products.h"
#include "backend/cpu/kernels.h"
#include "backend/opaque_backend.h"
#include "backend/reference_kernels.h"
#include "tensor/quantized.h"
#include "test_util.h"

namespace paraflow {
namespace {

using testing::random_vector;
using Vec = std::vector<double>;

// Awkward sizes on purpose: nothing a multiple of 8, a sequence that is not a power of two.
struct Dims {
  int64_t B = 3, T = 13, C = 30, NH = 3, V = 47;
};

class OpsTest : public ::testing::TestWithParam<Backend*> {
 protected:
  Backend& backend() { return *GetParam(); }
  // Host values in and out of the backend's memory, through its copies only.
  Tensor put(const Vec& values, Shape shape) {
    return backend().upload(std::vector<float>(values.begin(), values.end()), std::move(shape), DType::f32);
  }
  Tensor put_ints(const std::vector<int32_t>& values, Shape shape) {
    return backend().upload(values, std::move(shape), DType::i32);
  }
  Vec get(const Tensor& tensor) {
    std::vector<float> values = backend().download<float>(tensor);
    return Vec(values.begin(), values.end());
  }
  Tensor zeros(Shape shape, DType dtype = DType::f32) { return backend().empty(std::move(shape), dtype); }
  // Values rounded to bf16 (or float16) in the backend's memory, and any floating-point tensor's
  // values back.
  Tensor to_bf16(const Vec& values, const Shape& shape, DType dtype = DType::bf16) {
    Tensor half = zeros(shape, dtype);
    backend().launch(Cast{.src = put(values, shape), .dst = half});
    return half;
  }
  Vec values(const Tensor& tensor) {
    if (tensor.dtype() == DType::f32) return get(tensor);
    Tensor f32 = zeros(tensor.shape());
    backend().launch(Cast{.src = tensor, .dst = f32});
    return get(f32);
  }
  // A gradient buffer full of NaN: a kernel told to assign must not read it.
  Tensor garbage(Shape shape) { return put(Vec(static_cast<size_t>(shape.numel()), std::nan("")), shape); }
  Rng rng{testing::test_seed()};
  Dims d;
};

TEST_P(OpsTest, Embedding) {
  std::vector<int32_t> tokens(d.B * d.T);
  for (auto& token : tokens) token = static_cast<int32_t>(rng.below(d.V));
  Vec wte = random_vector(rng, d.V * d.C), wpe = random_vector(rng, d.T * d.C), dout = random_vector(rng, d.B * d.T * d.C);
  Tensor tokens_t = put_ints(tokens, {d.B, d.T});
  Tensor out = zeros({d.B, d.T, d.C}), dwte = zeros({d.V, d.C}), dwpe = zeros({d.T, d.C});
  Tensor wte_t = put(wte, {d.V, d.C}), wpe_t = put(wpe, {d.T, d.C});
  backend().launch(EmbeddingForward{.out = out, .tokens = tokens_t, .wte = wte_t, .wpe = wpe_t});
  backend().launch(EmbeddingBackward{.dwte = dwte, .dwpe = dwpe, .dout = put(dout, {d.B * d.T, d.C}), .tokens = tokens_t});
  Vec ref_out, ref_dwte(d.V * d.C), ref_dwpe(d.T * d.C);
  reference::embedding_forward(ref_out, tokens, wte, wpe, d.B, d.T, d.C);
  reference::embedding_backward(ref_dwte, ref_dwpe, dout, tokens, d.B, d.T, d.C);
  EXPECT_CLOSE(get(out), ref_out, 2, "embedding out");
  EXPECT_CLOSE(get(dwte), ref_dwte, d.B * d.T, "embedding dwte");
  EXPECT_CLOSE(get(dwpe), ref_dwpe, d.B, "embedding dwpe");
}

// A decoding graph's embedding reads the token table where a model file holds it (bf16, f16 or
// block-quantized rows): each row looked up is the row's values as the tensor layer converts them,
// plus its position's; a token outside a vocabulary shard's rows adds nothing.
TEST(CpuEmbedding, ReadsTheTableAsAFileStoresIt) {
  Rng rng{testing::test_seed()};
  const int64_t B = 2, T = 5, V = 11, C = 256, vocab_begin = 3;
  std::vector<float> table(static_cast<size_t>(V * C)), wpe(static_cast<size_t>(T * C));
  for (float& value : table) value = static_cast<float>(rng.normal());
  for (float& value : wpe) value = static_cast<float>(rng.normal());
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(V + vocab_begin));  // some below the shard
  Backend& cpu = cpu_backend();
  for (DType stored : {DType::bf16, DType::f16, DType::q8_0, DType::q4_k, DType::q5_0}) {
    SCOPED_TRACE(dtype_name(stored));
    Tensor rows = Tensor::zeros(Shape{V, C}, stored);
    auto* bits = static_cast<uint16_t*>(rows.raw());
    for (size_t i = 0; i < table.size(); ++i) {
      if (stored == DType::bf16) bits[i] = f32_to_bf16(table[i]);
      if (stored == DType::f16) bits[i] = f32_to_f16(table[i]);
    }
    if (is_block_quantized(stored)) quantize_blocks(stored, table.data(), rows.raw(), V * C);
    std::vector<float> values(table.size());  // the stored rows' values
    for (size_t i = 0; i < table.size(); ++i) {
      if (stored == DType::bf16) values[i] = bf16_to_f32(bits[i]);
      if (stored == DType::f16) values[i] = f16_to_f32(bits[i]);
    }
    if (is_block_quantized(stored)) dequantize_blocks(stored, rows.raw(), values.data(), V * C);
    Tensor out = Tensor::zeros(Shape{B, T, C}, DType::f32);
    cpu.launch(EmbeddingForward{.out = out,
                                .tokens = cpu.upload(tokens, Shape{B, T}, DType::i32),
                                .wte = rows,
                                .wpe = cpu.upload(wpe, Shape{T, C}, DType::f32),
                                .vocab_begin = vocab_begin});
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t row = tokens[static_cast<size_t>(bt)] - vocab_begin;
      for (int64_t c = 0; c < C; ++c) {
        const float token = row >= 0 ? values[static_cast<size_t>(row * C + c)] : 0.0f;
        ASSERT_EQ(out.data<float>()[bt * C + c], token + wpe[static_cast<size_t>((bt % T) * C + c)]) << bt << ", " << c;
      }
    }
  }
}

TEST_P(OpsTest, LayerNorm) {
  int64_t N = d.B * d.T, C = d.C;
  Vec x = random_vector(rng, N * C, 2.0), w = random_vector(rng, C), b = random_vector(rng, C);
  Vec dout = random_vector(rng, N * C);
  for (double& value : x) value += 0.5;  // a non-zero mean
  Tensor out = zeros({N, C}), mean = zeros({N}), rstd = zeros({N});
  Tensor x_t = put(x, {N, C}), w_t = put(w, {C});
  backend().launch(LayernormForward{
      .out = out, .mean = mean, .rstd = rstd, .inp = x_t, .weight = w_t, .bias = put(b, {C}), .eps = 1e-5f});
  Tensor dx = garbage({N, C}), dw = zeros({C}), db = zeros({C});
  backend().launch(LayernormBackward{.dinp = dx,
                                     .dweight = dw,
                                     .dbias = db,
                                     .dout = put(dout, {N, C}),
                                     .inp = x_t,
                                     .weight = w_t,
                                     .mean = mean,
                                     .rstd = rstd});
  Vec ref_out, ref_dx(N * C), ref_dw(C), ref_db(C);
  reference::layernorm_forward(ref_out, x, w, b, N, C, 1e-5);
  reference::layernorm_backward(ref_dx, ref_dw, ref_db, dout, x, w, N, C, 1e-5);
  EXPECT_CLOSE(get(out), ref_out, C, "layernorm out");
  EXPECT_CLOSE(get(dx), ref_dx, C, "layernorm dx");
  EXPECT_CLOSE(get(dw), ref_dw, N, "layernorm dweight");
  EXPECT_CLOSE(get(db), ref_db, N, "layernorm dbias");
}

// The backward kernels split rows into one block per thread asked for: when OpenMP grants a
// smaller team (here a launch inside a parallel region, nested parallelism off) every block is
// still done — dx assigned over NaN, GELU's derivative and the bias gradient on every row.
TEST_P(OpsTest, BackwardRowsAreAllDoneWhenTheTeamIsSmallerThanAsked) {
  const int64_t N = 8, C = 16, OC = 24;
  Vec x = random_vector(rng, N * C), w = random_vector(rng, C), b = random_vector(rng, C);
  Vec mw = random_vector(rng, C * OC, 0.2), mb = random_vector(rng, OC), dout = random_vector(rng, N * C);
  Vec mdout = random_vector(rng, N * OC);
  Tensor x_t = put(x, {N, C}), w_t = put(w, {C}), mw_t = put(mw, {C, OC});
  Tensor out = zeros({N, C}), mean = zeros({N}), rstd = zeros({N}), mout = zeros({N, OC}), slope = zeros({N, OC});
  backend().launch(LayernormForward{
      .out = out, .mean = mean, .rstd = rstd, .inp = x_t, .weight = w_t, .bias = put(b, {C}), .eps = 1e-5f});
  backend().launch(MatmulForward{.out = mout, .gelu_slope = slope, .inp = x_t, .weight = mw_t, .bias = put(mb, {OC}), .gelu = true});
  Tensor dx = garbage({N, C}), dw = zeros({C}), db = zeros({C});
  Tensor mdx = garbage({N, C}), mdw = zeros({C, OC}), mdb = zeros({OC});
  const int asked = omp_get_max_threads(), levels = omp_get_max_active_levels();
  omp_set_num_threads(4);
  omp_set_max_active_levels(1);
#pragma omp parallel num_threads(2)
#pragma omp single
  {
    backend().launch(LayernormBackward{.dinp = dx, .dweight = dw, .dbias = db, .dout = put(dout, {N, C}), .inp = x_t,
                                       .weight = w_t, .mean = mean, .rstd = rstd});
    backend().launch(MatmulBackward{.dinp = mdx, .dweight = mdw, .dbias = mdb, .dout = put(mdout, {N, OC}),
                                    .inp = x_t, .weight = mw_t, .gelu_slope = slope, .gelu = true});
  }
  omp_set_num_threads(asked);
  omp_set_max_active_levels(levels);
  Vec ref_dx(N * C), ref_dw(C), ref_db(C), ref_mdx(N * C), ref_mdw(C * OC), ref_mdb(OC);
  reference::layernorm_backward(ref_dx, ref_dw, ref_db, dout, x, w, N, C, 1e-5);
  reference::matmul_backward(ref_mdx, ref_mdw, &ref_mdb, mdout, x, mw, &mb, N, C, OC, false, true);
  EXPECT_CLOSE(get(dx), ref_dx, C, "layernorm dx");
  EXPECT_CLOSE(get(dw), ref_dw, N, "layernorm dweight");
  EXPECT_CLOSE(get(db), ref_db, N, "layernorm dbias");
  EXPECT_CLOSE(get(mdx), ref_mdx, OC, "matmul dx");
  EXPECT_CLOSE(get(mdw), ref_mdw, N, "matmul dweight");
  EXPECT_CLOSE(get(mdb), ref_mdb, N, "matmul dbias");
}

struct MatmulCase {
  bool transposed, gelu, bias;
};

// Many rows (the GEMM path) and 3 (decoding's few-rows path).
TEST_P(OpsTest, Matmul) {
  const int64_t C = d.C, OC = 3 * d.C + 1;
  for (int64_t N : {d.B * d.T, int64_t{3}})
  for (MatmulCase mc : {MatmulCase{false, false, true}, MatmulCase{false, true, true}, MatmulCase{true, false, false}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << N << " transposed=" << mc.transposed << " gelu=" << mc.gelu);
    Vec x = random_vector(rng, N * C), w = random_vector(rng, C * OC, 0.2), b = random_vector(rng, OC);
    Vec dout = random_vector(rng, N * OC);
    Tensor x_t = put(x, {N, C}), w_t = put(w, mc.transposed ? Shape{OC, C} : Shape{C, OC});
    Tensor out = zeros({N, OC}), slope = mc.gelu ? zeros({N, OC}) : Tensor();
    WeightLayout layout = mc.transposed ? WeightLayout::out_in : WeightLayout::in_out;
    backend().launch(MatmulForward{.out = out,
                                   .gelu_slope = slope,
                                   .inp = x_t,
                                   .weight = w_t,
                                   .bias = mc.bias ? put(b, {OC}) : Tensor(),
                                   .layout = layout,
                                   .gelu = mc.gelu});
    // dx accumulates onto a non-zero start in one case and is assigned over garbage in the others.
    Vec dx_start = mc.transposed ? random_vector(rng, N * C) : Vec(N * C, 0.0);
    Tensor dx = mc.transposed ? put(dx_start, {N, C}) : garbage({N, C});
    // dW is assigned over garbage in the GELU case (its first writer), accumulated onto zeros otherwise.
    Tensor dw = mc.gelu ? garbage(w_t.shape()) : zeros(w_t.shape()), db = mc.bias ? zeros({OC}) : Tensor();
    backend().launch(MatmulBackward{.dinp = dx,
                                    .dweight = dw,
                                    .dbias = db,
                                    .dout = put(dout, {N, OC}),
                                    .inp = x_t,
                                    .weight = w_t,
                                    .gelu_slope = slope,
                                    .layout = layout,
                                    .gelu = mc.gelu,
                                    .accumulate_dinp = mc.transposed,
                                    .accumulate_dweight = !mc.gelu});
    Vec ref_out, ref_dx = dx_start, ref_dw(C * OC), ref_db(OC);
    reference::matmul_forward(ref_out, x, w, mc.bias ? &b : nullptr, N, C, OC, mc.transposed, mc.gelu);
    reference::matmul_backward(ref_dx, ref_dw, &ref_db, dout, x, w, mc.bias ? &b : nullptr, N, C, OC, mc.transposed,
                               mc.gelu);
    EXPECT_CLOSE(get(out), ref_out, C, "matmul out");
    EXPECT_CLOSE(get(dx), ref_dx, OC, "matmul dx");
    EXPECT_CLOSE(get(dw), ref_dw, N, "matmul dweight");
    if (mc.bias) EXPECT_CLOSE(get(db), ref_db, N, "matmul dbias");
  }
}

// Decoding keeps no GELU slope: a forward pass without one gives the same outputs, bit for bit,
// as one that keeps it, on the GEMM's path (many rows) and the few-rows kernel, in f32 and (where
// the backend has it) with bf16 operands; a backward pass over such a forward is refused.
TEST_P(OpsTest, MatmulWithoutGeluSlopeGivesTheSameOutput) {
  const int64_t C = d.C, OC = 3 * d.C + 1;
  std::vector<DType> dtypes{DType::f32};
  if (backend().supports(KernelOp::matmul_forward, DType::bf16)) dtypes.push_back(DType::bf16);
  for (DType dtype : dtypes)
  for (int64_t N : {d.B * d.T, int64_t{3}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << N << " dtype=" << dtype_name(dtype));
    Vec x = random_vector(rng, N * C), w = random_vector(rng, C * OC, 0.2);
    Tensor x_t = dtype == DType::bf16 ? to_bf16(x, {N, C}) : put(x, {N, C});
    Tensor w_t = dtype == DType::bf16 ? to_bf16(w, {C, OC}) : put(w, {C, OC});
    Tensor bias = put(random_vector(rng, OC), {OC});
    Tensor kept = zeros({N, OC}, dtype), alone = zeros({N, OC}, dtype);
    backend().launch(MatmulForward{
        .out = kept, .gelu_slope = zeros({N, OC}, dtype), .inp = x_t, .weight = w_t, .bias = bias, .gelu = true});
    backend().launch(MatmulForward{.out = alone, .inp = x_t, .weight = w_t, .bias = bias, .gelu = true});
    EXPECT_EQ(values(kept), values(alone));
  }
  const int64_t N = 3;
  Tensor x_t = put(random_vector(rng, N * C), {N, C});
  try {
    backend().launch(MatmulBackward{.dinp = zeros({N, C}),
                                    .dout = put(random_vector(rng, N * OC), {N, OC}),
                                    .inp = x_t,
                                    .weight = put(random_vector(rng, C * OC), {C, OC}),
                                    .gelu = true});
    ADD_FAILURE() << "a backward pass with GELU and no slope was run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no gelu_slope"), std::string::npos) << e.what();
  }
}

// A weight gradient at training size with a narrow output (512 x 256 in either layout, 1024 rows:
// the 2^27 multiply-adds from which the GEMM engine by shape hands it to OpenBLAS), assigned over
// garbage and accumulated onto a start, against float64.
TEST_P(OpsTest, WeightGradientOfATrainingBatch) {
  const int64_t N = 1024, C = 256, OC = 512;
  for (bool transposed : {false, true})
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "transposed=" << transposed << " accumulate=" << accumulate);
    Vec x = random_vector(rng, N * C), w = random_vector(rng, C * OC, 0.2), dout = random_vector(rng, N * OC);
    Vec dw_start = accumulate ? random_vector(rng, C * OC) : Vec(C * OC, 0.0);
    Tensor w_t = put(w, transposed ? Shape{OC, C} : Shape{C, OC});
    Tensor dw = accumulate ? put(dw_start, w_t.shape()) : garbage(w_t.shape());
    backend().launch(MatmulBackward{.dweight = dw,
                                    .dout = put(dout, {N, OC}),
                                    .inp = put(x, {N, C}),
                                    .weight = w_t,
                                    .layout = transposed ? WeightLayout::out_in : WeightLayout::in_out,
                                    .accumulate_dweight = accumulate});
    Vec ref_dx(N * C), ref_dw = dw_start;
    reference::matmul_backward(ref_dx, ref_dw, nullptr, dout, x, w, nullptr, N, C, OC, transposed, false);
    EXPECT_CLOSE(get(dw), ref_dw, N, "matmul dweight");
  }
}

// Serving's row-invariant matmul: every row of a batch of 37 equals, bit for bit, the same row
// computed alone (and the reference within the usual bound), in f32 and, where the backend has
// it, with bf16 operands — the weights in each layout, with bias and GELU, and without either
// (f32 outputs then summed in place); where the CPU has AMX, bf16 weights of 96 input features
// also out_in_tiles (65 do not make whole tiles). 91 and 2053 outputs leave a tail (11 and 5 rows
// after the last group of 16, kept out_in), and 2053 give each thread's share (up to 16 threads)
// two groups at a time. A product of weights stored for decoding (interleaved or tiled) not
// marked row-invariant takes the same kernel, bit for bit.
TEST_P(OpsTest, RowInvariantMatmulRowsDoNotDependOnTheBatch) {
  const int64_t N = 37;
  std::vector<DType> dtypes{DType::f32};
  if (backend().supports(KernelOp::matmul_forward, DType::bf16)) dtypes.push_back(DType::bf16);
  for (int64_t OC : {3 * d.C + 1, int64_t{2053}})
  for (bool finished : {true, false})
  for (int64_t C : {int64_t{65}, int64_t{96}})
  for (DType dtype : dtypes) {
    // One set of operands for every layout (w read as [C, OC] by in_out, [OC, C] by the others).
    Vec x = random_vector(rng, N * C), w = random_vector(rng, C * OC, 0.2), b = random_vector(rng, OC);
    if (dtype == DType::bf16) {  // the reference multiplies the operands the kernel sees
      w = values(to_bf16(w, {C * OC}));
      x = values(to_bf16(x, {N * C}));
    }
    for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in, WeightLayout::out_in_interleaved,
                                WeightLayout::out_in_tiles}) {
      const bool interleaved = layout == WeightLayout::out_in_interleaved, tiled = layout == WeightLayout::out_in_tiles;
      if (tiled && !(dtype == DType::bf16 && C % 32 == 0 && backend().prefers_tiled_weights(dtype))) continue;
      // The layout wherever the backend's kernel reads it (its f32 row-invariant matmul prefers
      // it then), bf16 too even where decoding keeps bf16 rows for the AVX512_BF16/AMX kernels.
      const bool reads_interleaved = backend().prefers_interleaved_weights(DType::f32);
      if (interleaved && !reads_interleaved) continue;
      const bool transposed = layout != WeightLayout::in_out;
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " C=" << C << " OC=" << OC
                                        << " layout=" << static_cast<int>(layout) << " bias and GELU " << finished);
      const Shape w_shape = transposed ? Shape{OC, C} : Shape{C, OC};
      const Vec stored = interleaved ? testing::arranged(w, OC, C, interleaved_offset)
                         : tiled     ? testing::arranged(w, OC, C, tiles_offset)
                                     : w;
      Tensor w_t = dtype == DType::bf16 ? to_bf16(stored, w_shape) : put(stored, w_shape);
      auto run = [&](int64_t first, int64_t rows, bool row_invariant = true) {
        Vec part(x.begin() + first * C, x.begin() + (first + rows) * C);
        Tensor x_t = dtype == DType::bf16 ? to_bf16(part, {rows, C}) : put(part, {rows, C});
        Tensor out = zeros({rows, OC}), slope = zeros({rows, OC});
        backend().launch(MatmulForward{.out = out, .gelu_slope = finished ? slope : Tensor{}, .inp = x_t, .weight = w_t,
                                       .bias = finished ? put(b, {OC}) : Tensor{}, .layout = layout, .gelu = finished,
                                       .row_invariant = row_invariant});
        return get(out);
      };
      // Blocks of every size the kernels take rows in: the batch of 37 (dot products: blocks of
      // 3 with AVX2, of 4 with AVX-512 (vdpbf16ps or widened bf16), then the rest; panels: blocks
      // of 5 and 6 with AVX2, 12 and 13 with AVX-512; tiles: two of 16, then one of 5), 32 rows
      // (AVX-512 panels: two of 16, the most they take), seven rows (AVX2 panels: 3 and 4; 4 + 3),
      // a pair, and rows alone.
      const Vec batched = run(0, N), thirty_two = run(5, 32), seven = run(3, 7), pair = run(5, 2);
      for (int64_t row : {int64_t{0}, int64_t{5}, int64_t{6}, N - 1}) {
        const Vec alone = run(row, 1);
        for (int64_t o = 0; o < OC; ++o) {
          ASSERT_EQ(alone[static_cast<size_t>(o)], batched[static_cast<size_t>(row * OC + o)]) << "row " << row << " output " << o;
          if (row == 5 || row == 6) {
            ASSERT_EQ(alone[static_cast<size_t>(o)], seven[static_cast<size_t>((row - 3) * OC + o)]) << "of seven, row " << row;
            ASSERT_EQ(alone[static_cast<size_t>(o)], pair[static_cast<size_t>((row - 5) * OC + o)]) << "pair row " << row;
            ASSERT_EQ(alone[static_cast<size_t>(o)], thirty_two[static_cast<size_t>((row - 5) * OC + o)])
                << "of 32, row " << row;
          }
        }
      }
      Vec reference_out;
      reference::matmul_forward(reference_out, x, w, finished ? &b : nullptr, N, C, OC, transposed, finished);
      EXPECT_CLOSE(batched, reference_out, C, "row-invariant matmul out");
      if (interleaved || tiled) {
        EXPECT_EQ(run(0, N, false), batched) << "stored for decoding, not marked row-invariant";
      }
    }
  }
}

// Decoding's float16 weights times f32 rows: stored out_in_tiles, in half arithmetic (where the
// backend prefers that layout for float16: AVX512_FP16), stored out_in_interleaved (where it
// prefers that: the f32 panels, widening the halves), and stored out_in, widened to f32. Every
// output within half_products_error_bound of the float64 product of the f32 rows and the float16
// weights, plus f32's rounding of the bias addition; each row the same bits alone, in a pair and
// in the batch of 37. Rows scaled by 1e4 and 1e-6 check the per-row scaling (half's range is 6e-5
// to 65504); 66 columns make one partial tile of column pairs, 1,576 thirteen (the last partial);
// 91 and 2,053 outputs leave 11 and 5 rows after the last group of 16; a weight row of 60,000s
// overflows half and must come back through the f32 sum, finite and exact to f32's bound.
TEST_P(OpsTest, Float16WeightMatmulWithinItsBoundAndRowInvariant) {
  const int64_t N = 37;
  std::vector<WeightLayout> layouts{WeightLayout::out_in};
  if (backend().prefers_tiled_weights(DType::f16)) layouts.push_back(WeightLayout::out_in_tiles);
  if (backend().prefers_interleaved_weights(DType::f16)) layouts.push_back(WeightLayout::out_in_interleaved);
  for (auto [C, OC] : {std::pair{int64_t{66}, int64_t{91}}, std::pair{int64_t{1576}, int64_t{2053}}}) {
    Vec x = random_vector(rng, N * C, 2.0), w = random_vector(rng, OC * C, 0.2), b = random_vector(rng, OC);
    for (int64_t c = 0; c < C; ++c) {
      x[static_cast<size_t>(1 * C + c)] *= 1e4;
      x[static_cast<size_t>(2 * C + c)] *= 1e-6;
      w[static_cast<size_t>(7 * C + c)] = c % 3 == 0 ? 60000.0 : 0.25;
    }
    w = values(to_bf16(w, {OC, C}, DType::f16));  // the reference multiplies the weights the kernel sees
    for (WeightLayout layout : layouts) {
      SCOPED_TRACE(::testing::Message() << "C=" << C << " OC=" << OC << " " << weight_layout_name(layout));
      const Vec stored = layout == WeightLayout::out_in_tiles         ? testing::arranged(w, OC, C, tiles_offset)
                         : layout == WeightLayout::out_in_interleaved ? testing::arranged(w, OC, C, interleaved_offset)
                                                                      : w;
      Tensor w_t = to_bf16(stored, {OC, C}, DType::f16);
      auto run = [&](int64_t first, int64_t rows) {
        Vec part(x.begin() + first * C, x.begin() + (first + rows) * C);
        Tensor out = zeros({rows, OC});
        backend().launch(MatmulForward{.out = out, .inp = put(part, {rows, C}), .weight = w_t, .bias = put(b, {OC}),
                                       .layout = layout, .row_invariant = true});
        return get(out);
      };
      const Vec batched = run(0, N), pair = run(5, 2);
      for (int64_t row : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{6}, N - 1}) {
        const Vec alone = run(row, 1);
        for (int64_t o = 0; o < OC; ++o) {
          ASSERT_EQ(alone[static_cast<size_t>(o)], batched[static_cast<size_t>(row * OC + o)]) << "row " << row << " output " << o;
          if (row == 5 || row == 6) {
            ASSERT_EQ(alone[static_cast<size_t>(o)], pair[static_cast<size_t>((row - 5) * OC + o)]) << "pair row " << row;
          }
        }
      }
      for (int64_t n = 0; n < N; ++n) {
        double largest = 0;
        for (int64_t c = 0; c < C; ++c) largest = std::max(largest, std::fabs(static_cast<double>(static_cast<float>(x[static_cast<size_t>(n * C + c)]))));
        for (int64_t o = 0; o < OC; ++o) {
          double exact = 0, sum_abs = 0;
          for (int64_t c = 0; c < C; ++c) {
            const double product = static_cast<double>(static_cast<float>(x[static_cast<size_t>(n * C + c)])) * w[static_cast<size_t>(o * C + c)];
            exact += product;
            sum_abs += std::fabs(product);
          }
          const double bias = static_cast<float>(b[static_cast<size_t>(o)]);
          // A row's scale brings its largest magnitude to at least 16, so its inverse is at most largest / 16.
          const double bound = cpu::half_products_error_bound(sum_abs, largest / 16, C) +
                               std::ldexp(1.0, -24) * (std::fabs(exact) + std::fabs(bias) + 1e-30);
          const double got = batched[static_cast<size_t>(n * OC + o)];
          ASSERT_TRUE(std::isfinite(got)) << "row " << n << " output " << o;
          ASSERT_LE(std::fabs(got - (exact + bias)), bound) << "row " << n << " output " << o << " exact " << exact + bias;
        }
      }
    }
  }
}

// GPT-2's score scale, 1/sqrt(head size).
double gpt2_scale(int64_t C, int64_t NH) { return 1 / std::sqrt(static_cast<double>(C / NH)); }

TEST_P(OpsTest, Attention) {
  // GPT-2's scale with one head and with several; then Hugging Face's scale_attn_weights false
  // (scale 1) and scale_attn_by_inverse_layer_idx in layer 2 (GPT-2's scale / 3).
  const double gpt2 = gpt2_scale(d.C, d.NH);
  for (auto [NH, scale] : {std::pair{int64_t{1}, gpt2_scale(d.C, 1)}, std::pair{d.NH, gpt2}, std::pair{d.NH, 1.0},
                           std::pair{d.NH, gpt2 / 3}}) {
    SCOPED_TRACE(::testing::Message() << "n_head=" << NH << " scale=" << scale);
    Vec qkv = random_vector(rng, d.B * d.T * 3 * d.C), dout = random_vector(rng, d.B * d.T * d.C);
    const bool accumulate = NH == 1;
    Vec dqkv_start = accumulate ? random_vector(rng, d.B * d.T * 3 * d.C) : Vec(d.B * d.T * 3 * d.C, 0.0);
    Tensor out = zeros({d.B, d.T, d.C}), logsumexp = zeros({d.B, NH, d.T});
    Tensor dqkv = accumulate ? put(dqkv_start, {d.B, d.T, 3 * d.C}) : garbage({d.B, d.T, 3 * d.C});
    Tensor qkv_t = put(qkv, {d.B, d.T, 3 * d.C});
    backend().launch(AttentionForward{
        .out = out, .logsumexp = logsumexp, .qkv = qkv_t, .n_head = NH, .scale = static_cast<float>(scale)});
    backend().launch(AttentionBackward{.dqkv = dqkv,
                                       .dout = put(dout, {d.B, d.T, d.C}),
                                       .qkv = qkv_t,
                                       .logsumexp = logsumexp,
                                       .n_head = NH,
                                       .scale = static_cast<float>(scale),
                                       .accumulate_dqkv = accumulate});
    Vec ref_out, ref_dqkv = dqkv_start;
    reference::attention_forward(ref_out, qkv, d.B, d.T, d.C, NH, scale);
    reference::attention_backward(ref_dqkv, dout, qkv, d.B, d.T, d.C, NH, scale);
    EXPECT_CLOSE(get(out), ref_out, d.C / NH + d.T, "attention out");
    EXPECT_CLOSE(get(dqkv), ref_dqkv, d.C / NH + d.T, "attention dqkv");
  }
}

// Serving's attention over a paged KV cache, in two steps (a prefill of each sequence's first
// tokens, then the rest, reading the first step's keys and values from the pools), two sequences
// in one ragged batch, their blocks scattered over the pool: each token's output against causal
// attention over its own sequence. With bf16 pools the reference reads the keys and values
// rounded to bf16. Two shapes: heads of 10 (the kernel's scalar path) in blocks of 4, and heads
// of 16 (its vector path: keys eight at a time, and fewer) in blocks of 8.
TEST_P(OpsTest, PagedAttentionOfARaggedBatch) {
  const int64_t blocks = 10, max_blocks = 4;
  const std::vector<int64_t> lengths{13, 7}, first_step{9, 4};
  const std::vector<std::vector<int32_t>> tables{{2, 5, 0, 7}, {9, 1, 0, 0}};
  for (auto [C, NH, block_size] : {std::tuple{d.C, d.NH, int64_t{4}}, std::tuple{int64_t{32}, int64_t{2}, int64_t{8}}}) {
    for (DType pool_dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(pool_dtype) << " C=" << C << " block_size=" << block_size);
      const int64_t hs = C / NH;
      const double scale = gpt2_scale(C, NH);
      std::vector<Vec> sequences;  // each (T, 3C)
      for (int64_t T : lengths) sequences.push_back(random_vector(rng, T * 3 * C));
      Tensor k_pool = zeros({blocks, NH, block_size, hs}, pool_dtype), v_pool = zeros({blocks, NH, block_size, hs}, pool_dtype);
      for (int step = 0; step < 2; ++step) {
        Vec qkv;
        std::vector<int32_t> positions, block_tables;
        std::vector<std::pair<size_t, int64_t>> rows;  // (sequence, position) of each token
        for (size_t s = 0; s < lengths.size(); ++s) {
          const int64_t begin = step == 0 ? 0 : first_step[s], end = step == 0 ? first_step[s] : lengths[s];
          for (int64_t t = begin; t < end; ++t) {
            qkv.insert(qkv.end(), sequences[s].begin() + t * 3 * C, sequences[s].begin() + (t + 1) * 3 * C);
            positions.push_back(static_cast<int32_t>(t));
            block_tables.insert(block_tables.end(), tables[s].begin(), tables[s].end());
            rows.emplace_back(s, t);
          }
        }
        const auto N = static_cast<int64_t>(rows.size());
        Tensor positions_t = Tensor::zeros({N}, DType::i32), tables_t = Tensor::zeros({N, max_blocks}, DType::i32);
        std::copy(positions.begin(), positions.end(), positions_t.data<int32_t>());  // host memory, as the op declares
        std::copy(block_tables.begin(), block_tables.end(), tables_t.data<int32_t>());
        Tensor out = zeros({N, 1, C});
        backend().launch(AttentionPagedForward{.out = out, .qkv = put(qkv, {N, 1, 3 * C}), .k_pool = k_pool,
                                               .v_pool = v_pool, .positions = positions_t, .block_tables = tables_t,
                                               .n_head = NH, .scale = static_cast<float>(scale)});
        Vec expected;
        for (const auto& [s, t] : rows) {
          Vec keys_rounded = sequences[s];
          if (pool_dtype == DType::bf16) {  // k and v as the pool holds them; q as given
            for (int64_t row = 0; row < lengths[s]; ++row) {
              const auto kv = keys_rounded.begin() + row * 3 * C + C;
              const Vec rounded = values(to_bf16(Vec(kv, kv + 2 * C), {2 * C}));
              std::copy(rounded.begin(), rounded.end(), kv);
            }
          }
          for (int64_t c = 0; c < C; ++c) keys_rounded[static_cast<size_t>(t * 3 * C + c)] = sequences[s][static_cast<size_t>(t * 3 * C + c)];
          Vec reference_out;
          reference::attention_forward(reference_out, keys_rounded, 1, lengths[s], C, NH, scale);
          expected.insert(expected.end(), reference_out.begin() + t * C, reference_out.begin() + (t + 1) * C);
        }
        const char* what = step == 0 ? "paged attention, prefill" : "paged attention, the rest";
        EXPECT_CLOSE(get(out), expected, hs + lengths[0], what);
      }
    }
  }
}

// The generator's attention over a contiguous cache and the engine's over a paged one give a
// token the same bits (engine and generator promise a sequence the same tokens), whatever the
// grouping of its keys. The contiguous pass takes a prefill of 30 then 7 more tokens and groups
// keys by eight from the first; the paged one takes blocks of 16 (the same groups), of 5 (a
// group of eight never whole, and every key in another lane) and of 6 (a head's scores 42 floats
// after the previous head's: buffers of another alignment), and the last token again alone.
// Heads of 64 (vector path), 24 (vector path with AVX2's 8 lanes; scalar with AVX-512's 16), 10
// (scalar path); and within float64's bound.
TEST_P(OpsTest, PagedAndContiguousCachesGiveATokenTheSameBits) {
  const int64_t T = 37, prefill = 30, pool_blocks = 10;
  const std::vector<int32_t> pool_order{9, 3, 0, 7, 1, 5, 8, 2};  // blocks as tables use them
  for (auto [C, NH] : {std::pair{int64_t{128}, int64_t{2}}, std::pair{int64_t{48}, int64_t{2}}, std::pair{d.C, d.NH}}) {
    SCOPED_TRACE(::testing::Message() << "C=" << C << " n_head=" << NH);
    const int64_t hs = C / NH;
    const auto scale = static_cast<float>(gpt2_scale(C, NH));
    const Vec qkv = random_vector(rng, T * 3 * C);
    Tensor k_cache = zeros({1, NH, T, hs}), v_cache = zeros({1, NH, T, hs});
    Vec contiguous;
    for (auto [past, count] : {std::pair{int64_t{0}, prefill}, std::pair{prefill, T - prefill}}) {
      Tensor out = zeros({1, count, C});
      backend().launch(AttentionCachedForward{
          .out = out,
          .qkv = put(Vec(qkv.begin() + past * 3 * C, qkv.begin() + (past + count) * 3 * C), {1, count, 3 * C}),
          .k_cache = k_cache, .v_cache = v_cache, .n_head = NH, .scale = scale, .past = past});
      const Vec part = get(out);
      contiguous.insert(contiguous.end(), part.begin(), part.end());
    }
    Vec reference_out;
    reference::attention_forward(reference_out, qkv, 1, T, C, NH, scale);
    EXPECT_CLOSE(contiguous, reference_out, hs + T, "attention over a contiguous cache");
    for (int64_t block_size : {16, 5, 6}) {
      SCOPED_TRACE(::testing::Message() << "block_size=" << block_size);
      const int64_t max_blocks = (T + block_size - 1) / block_size;
      Tensor positions = Tensor::zeros({T}, DType::i32), tables = Tensor::zeros({T, max_blocks}, DType::i32);
      for (int64_t t = 0; t < T; ++t) {  // host memory, as the op declares
        positions.data<int32_t>()[t] = static_cast<int32_t>(t);
        std::copy(pool_order.begin(), pool_order.begin() + max_blocks, tables.data<int32_t>() + t * max_blocks);
      }
      Tensor paged = zeros({T, 1, C}), k_pool = zeros({pool_blocks, NH, block_size, hs}),
             v_pool = zeros({pool_blocks, NH, block_size, hs});
      backend().launch(AttentionPagedForward{.out = paged, .qkv = put(qkv, {T, 1, 3 * C}), .k_pool = k_pool,
                                             .v_pool = v_pool, .positions = positions, .block_tables = tables,
                                             .n_head = NH, .scale = scale});
      EXPECT_EQ(get(paged), contiguous);
      // The last token alone, its heads split among the threads.
      Tensor last = zeros({1, 1, C});
      backend().launch(AttentionPagedForward{
          .out = last, .qkv = put(Vec(qkv.end() - 3 * C, qkv.end()), {1, 1, 3 * C}), .k_pool = k_pool,
          .v_pool = v_pool, .positions = positions.slice_flat(T - 1, 1),
          .block_tables = tables.slice_flat((T - 1) * max_blocks, max_blocks).reshape({1, max_blocks}),
          .n_head = NH, .scale = scale});
      EXPECT_EQ(get(last), Vec(contiguous.end() - C, contiguous.end()));
    }
  }
}

// Rows at consecutive positions go through their keys together only where their block tables
// agree on every block the first row sees: here two sequences share their first block but not
// their second, and a row of each (positions 5 and 6, blocks of 4) must get what it gets alone.
// (Read through the first row's table, the second row's keys 4 and 5 would be the other
// sequence's.) Then four rows of one sequence in one step (one tile) against the same rows one
// step each, as decoding would take them.
TEST_P(OpsTest, PagedAttentionGroupsOnlyRowsThatShareTheirBlocks) {
  const int64_t C = 32, NH = 2, hs = C / NH, block_size = 4, pool_blocks = 6, max_blocks = 2;
  const auto scale = static_cast<float>(gpt2_scale(C, NH));
  const Vec keys = random_vector(rng, pool_blocks * C * block_size), values = random_vector(rng, pool_blocks * C * block_size);
  struct Pools {
    Tensor keys, values;
  };
  auto fresh_pools = [&] {
    return Pools{put(keys, {pool_blocks, NH, block_size, hs}), put(values, {pool_blocks, NH, block_size, hs})};
  };
  auto attend = [&](const Pools& pools, const std::vector<int32_t>& positions, const std::vector<int32_t>& tables,
                    const Vec& qkv) {
    const auto N = static_cast<int64_t>(positions.size());
    Tensor positions_t = Tensor::zeros({N}, DType::i32), tables_t = Tensor::zeros({N, max_blocks}, DType::i32);
    std::copy(positions.begin(), positions.end(), positions_t.data<int32_t>());  // host memory, as the op declares
    std::copy(tables.begin(), tables.end(), tables_t.data<int32_t>());
    Tensor out = zeros({N, 1, C});
    backend().launch(AttentionPagedForward{.out = out, .qkv = put(qkv, {N, 1, 3 * C}), .k_pool = pools.keys,
                                           .v_pool = pools.values, .positions = positions_t,
                                           .block_tables = tables_t, .n_head = NH, .scale = scale});
    return get(out);
  };
  auto together_and_one_by_one = [&](const std::vector<int32_t>& positions, const std::vector<int32_t>& tables,
                                     const Vec& qkv) {
    const Vec together = attend(fresh_pools(), positions, tables, qkv);
    const Pools pools = fresh_pools();
    Vec one_by_one;
    for (int64_t i = 0; i < static_cast<int64_t>(positions.size()); ++i) {
      const Vec row = attend(pools, {positions[static_cast<size_t>(i)]},
                             {tables.begin() + i * max_blocks, tables.begin() + (i + 1) * max_blocks},
                             Vec(qkv.begin() + i * 3 * C, qkv.begin() + (i + 1) * 3 * C));
      one_by_one.insert(one_by_one.end(), row.begin(), row.end());
    }
    EXPECT_EQ(together, one_by_one);
  };
  together_and_one_by_one({5, 6}, {3, 1, 3, 4}, random_vector(rng, 2 * 3 * C));
  together_and_one_by_one({2, 3, 4, 5}, {0, 2, 0, 2, 0, 2, 0, 2}, random_vector(rng, 4 * 3 * C));
}

TEST_P(OpsTest, AttentionOverSeveralCausalBlocks) {
  // T = 150 spans three of the CPU kernel's 64-row blocks (the last one partial).
  const int64_t B = 2, T = 150, C = 24, NH = 2;
  for (bool accumulate : {false, true}) {
    Vec qkv = random_vector(rng, B * T * 3 * C), dout = random_vector(rng, B * T * C);
    Vec dqkv_start = accumulate ? random_vector(rng, B * T * 3 * C) : Vec(B * T * 3 * C, 0.0);
    Tensor qkv_t = put(qkv, {B, T, 3 * C});
    Tensor out = zeros({B, T, C}), logsumexp = garbage({B, NH, T});
    Tensor dqkv = accumulate ? put(dqkv_start, {B, T, 3 * C}) : garbage({B, T, 3 * C});
    const auto scale = static_cast<float>(gpt2_scale(C, NH));
    backend().launch(AttentionForward{.out = out, .logsumexp = logsumexp, .qkv = qkv_t, .n_head = NH, .scale = scale});
    backend().launch(AttentionBackward{.dqkv = dqkv,
                                       .dout = put(dout, {B, T, C}),
                                       .qkv = qkv_t,
                                       .logsumexp = logsumexp,
                                       .n_head = NH,
                                       .scale = scale,
                                       .accumulate_dqkv = accumulate});
    Vec ref_out, ref_dqkv = dqkv_start;
    reference::attention_forward(ref_out, qkv, B, T, C, NH, scale);
    reference::attention_backward(ref_dqkv, dout, qkv, B, T, C, NH, scale);
    EXPECT_CLOSE(get(out), ref_out, C / NH + T, "attention out, 3 blocks");
    EXPECT_CLOSE(get(dqkv), ref_dqkv, C / NH + T, "attention dqkv, 3 blocks");
  }
}

// Attention reading bf16 q, k, v and writing bf16 outputs and gradients, its products with bf16
// operands and f32 sums, against float64 on the rounded inputs. The softmax runs in f32; its
// probabilities and the scores' gradients are rounded to bf16 as operands (a relative eps/2 each,
// eps = 2^-7), and so are the outputs (and an accumulated gradient's sum): together within 2 eps
// norm-wise, as for the other bf16 kernels.
TEST_P(OpsTest, AttentionInBf16) {
  // The CPU backend registers its bf16 attention only where bf16 training runs (AMX, or
  // AVX512_BF16 on AMD); on other CPUs with bf16 arithmetic the test calls those kernels directly.
  const bool registered = backend().supports(KernelOp::attention_forward, DType::bf16);
  if (!registered && (backend().device() != Device{} || !cpu::has_native_bf16())) {
    GTEST_SKIP() << backend().name() << " has no bf16 attention kernels on this CPU (oneDNN "
                 << cpu::onednn_isa_name() << ")";
  }
  auto launch_forward = [&](const AttentionForward& args) {
    registered ? backend().launch(args) : cpu::attention_forward_bf16(args);
  };
  auto launch_backward = [&](const AttentionBackward& args) {
    registered ? backend().launch(args) : cpu::attention_backward_bf16(args);
  };
  const double epsilon = 0x1.0p-7;
  const int64_t B = 2, T = 150, C = 24, NH = 2;  // three of the kernel's 64-row blocks
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "dqkv accumulated" : "dqkv assigned");
    Tensor qkv = to_bf16(random_vector(rng, B * T * 3 * C), {B, T, 3 * C});
    Tensor dout = to_bf16(random_vector(rng, B * T * C), {B, T, C});
    Tensor dqkv = accumulate ? to_bf16(random_vector(rng, B * T * 3 * C), {B, T, 3 * C}) : zeros({B, T, 3 * C}, DType::bf16);
    Vec ref_dqkv = accumulate ? values(dqkv) : Vec(B * T * 3 * C, 0.0);
    Tensor out = zeros({B, T, C}, DType::bf16), logsumexp = zeros({B, NH, T});
    const auto scale = static_cast<float>(gpt2_scale(C, NH));
    launch_forward(AttentionForward{.out = out, .logsumexp = logsumexp, .qkv = qkv, .n_head = NH, .scale = scale});
    launch_backward(AttentionBackward{.dqkv = dqkv,
                                      .dout = dout,
                                      .qkv = qkv,
                                      .logsumexp = logsumexp,
                                      .n_head = NH,
                                      .scale = scale,
                                      .accumulate_dqkv = accumulate});
    Vec ref_out;
    reference::attention_forward(ref_out, values(qkv), B, T, C, NH, scale);
    reference::attention_backward(ref_dqkv, values(dout), values(qkv), B, T, C, NH, scale);
    for (auto [actual, expected, what] : {std::tuple{values(out), ref_out, "out"}, std::tuple{values(dqkv), ref_dqkv, "dqkv"}}) {
      const double error = testing::relative_error(actual, expected);
      std::printf("  bf16 attention %-6s rel err %.3e (bound %.3e)\n", what, error, 2 * epsilon);
      EXPECT_LE(error, 2 * epsilon) << what;
    }
  }
}

TEST_P(OpsTest, Residual) {
  int64_t n = d.B * d.T * d.C;
  Vec a = random_vector(rng, n), b = random_vector(rng, n), dout = random_vector(rng, n);
  Tensor out = zeros({n}), dout_t = put(dout, {n});
  backend().launch(AddForward{.out = out, .a = put(a, {n}), .b = put(b, {n})});
  Tensor da = put(a, {n}), db = garbage({n});  // da accumulates onto a; db is assigned
  backend().launch(AddBackward{.da = da, .db = db, .dout = dout_t, .accumulate_a = true, .accumulate_b = false});
  Vec ref_out(n), ref_da(n);
  for (int64_t i = 0; i < n; ++i) {
    ref_out[i] = a[i] + b[i];
    ref_da[i] = a[i] + dout[i];
  }
  EXPECT_CLOSE(get(out), ref_out, 2, "add out");
  EXPECT_CLOSE(get(da), ref_da, 2, "add da (accumulated)");
  EXPECT_CLOSE(get(db), dout, 1, "add db");
}

// A backward pass where one input takes no gradient (a value no parameter feeds, a weight held
// fixed): the other gradients are right, and nothing is written through the missing one.
TEST_P(OpsTest, AnInputWithoutAGradientIsLeftOut) {
  const int64_t n = d.B * d.T * d.C;
  Vec dout = random_vector(rng, n);
  for (bool a_takes_it : {true, false}) {
    Tensor grad = garbage({n});
    backend().launch(AddBackward{.da = a_takes_it ? grad : Tensor(),
                                 .db = a_takes_it ? Tensor() : grad,
                                 .dout = put(dout, {n}),
                                 .accumulate_a = false,
                                 .accumulate_b = false});
    EXPECT_CLOSE(get(grad), dout, 1, (a_takes_it ? "add da alone" : "add db alone"));
  }
  const int64_t N = d.B * d.T, C = d.C, OC = 2 * d.C + 3;
  Vec x = random_vector(rng, N * C), w = random_vector(rng, C * OC, 0.2), dy = random_vector(rng, N * OC);
  Tensor dx = garbage({N, C});
  backend().launch(MatmulBackward{.dinp = dx,
                                  .dweight = Tensor(),
                                  .dout = put(dy, {N, OC}),
                                  .inp = put(x, {N, C}),
                                  .weight = put(w, {C, OC}),
                                  .layout = WeightLayout::in_out});
  Vec ref_dx(N * C), ref_dw(C * OC);
  reference::matmul_backward(ref_dx, ref_dw, nullptr, dy, x, w, nullptr, N, C, OC, false, false);
  EXPECT_CLOSE(get(dx), ref_dx, OC, "matmul dx with a fixed weight");
}

TEST_P(OpsTest, SoftmaxCrossEntropy) {
  int64_t N = d.B * d.T, V = d.V;
  Vec logits = random_vector(rng, N * V, 3.0), dlosses = random_vector(rng, N);
  std::vector<int32_t> targets(N);
  for (auto& target : targets) target = static_cast<int32_t>(rng.below(V));
  targets[1] = -1;  // ignored position
  Tensor logits_t = put(logits, {N, V}), dlosses_t = put(dlosses, {N}), targets_t = put_ints(targets, {N});
  Tensor losses = zeros({N}), stats = zeros({N, 2}), dlogits = garbage({N, V});
  backend().launch(SoftmaxXentForward{.losses = losses, .stats = stats, .logits = logits_t, .targets = targets_t});
  SoftmaxXentBackward backward{
      .dlogits = dlogits, .logits = logits_t, .stats = stats, .targets = targets_t, .dlosses = dlosses_t};
  backend().launch(backward);
  Vec ref_losses, ref_dlogits(N * V);
  reference::softmax_xent_forward(ref_losses, logits, targets, N, V);
  reference::softmax_xent_backward(ref_dlogits, logits, targets, dlosses, N, V);
  EXPECT_CLOSE(get(losses), ref_losses, V, "softmax_xent losses");
  EXPECT_CLOSE(get(dlogits), ref_dlogits, V, "softmax_xent dlogits");
  EXPECT_EQ(get(losses)[1], 0.0);
  // Accumulating adds the same contribution again.
  backward.accumulate = true;
  backend().launch(backward);
  for (double& value : ref_dlogits) value *= 2;
  EXPECT_CLOSE(get(dlogits), ref_dlogits, V, "softmax_xent dlogits (accumulated)");
}

// The 16-bit paths of the ops that read and write 16-bit activations directly (the
// mixed-precision policies' storage): inputs rounded to the format, the float64 reference
// computed on those rounded inputs, so what remains is the kernel's own error: its output
// rounding (u = eps/2) and f32 arithmetic. Bound: 2 eps, norm-wise.
TEST_P(OpsTest, LayerNormAndResidualIn16Bits) {
  for (auto [dtype, epsilon] : {std::pair{DType::bf16, 0x1.0p-7}, std::pair{DType::f16, 0x1.0p-10}}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto to_half = [&](const Vec& values) {
      Tensor half = zeros({static_cast<int64_t>(values.size())}, dtype);
      backend().launch(Cast{.src = put(values, {static_cast<int64_t>(values.size())}), .dst = half});
      return half;
    };
    auto to_vec = [&](const Tensor& half) {
      Tensor f32 = zeros({half.numel()});
      backend().launch(Cast{.src = half, .dst = f32});
      return get(f32);
    };
    const int64_t N = d.B * d.T, C = d.C;
    Tensor x = to_half(random_vector(rng, N * C, 2.0)).reshape({N, C}), dy = to_half(random_vector(rng, N * C));
    Vec w = random_vector(rng, C), b = random_vector(rng, C);
    Tensor w_t = put(w, {C});
    Tensor out = zeros({N, C}, dtype), dx = zeros({N, C}, dtype);
    Tensor mean = zeros({N}), rstd = zeros({N}), dw = zeros({C}), db = zeros({C});
    backend().launch(LayernormForward{
        .out = out, .mean = mean, .rstd = rstd, .inp = x, .weight = w_t, .bias = put(b, {C}), .eps = 1e-5f});
    backend().launch(LayernormBackward{.dinp = dx,
                                       .dweight = dw,
                                       .dbias = db,
                                       .dout = dy.reshape({N, C}),
                                       .inp = x,
                                       .weight = w_t,
                                       .mean = mean,
                                       .rstd = rstd});
    Vec ref_out, ref_dx(N * C), ref_dw(C), ref_db(C);
    reference::layernorm_forward(ref_out, to_vec(x), w, b, N, C, 1e-5);
    reference::layernorm_backward(ref_dx, ref_dw, ref_db, to_vec(dy), to_vec(x), w, N, C, 1e-5);
    auto check = [&](const Vec& actual, const Vec& expected, const char* what) {
      double error = testing::relative_error(actual, expected);
      std::printf("  %-5s %-24s rel err %.3e (bound %.3e)\n", dtype_name(dtype), what, error, 2 * epsilon);
      EXPECT_LE(error, 2 * epsilon) << what;
    };
    check(to_vec(out), ref_out, "layernorm out");
    check(to_vec(dx), ref_dx, "layernorm dx");
    check(get(dw), ref_dw, "layernorm dweight");

    Tensor a = to_half(random_vector(rng, N * C)), c = to_half(random_vector(rng, N * C));
    Tensor sum = zeros({N * C}, dtype), da = zeros({N * C}, dtype), dc = to_half(Vec(N * C, 0.5));
    backend().launch(AddForward{.out = sum, .a = a, .b = c});
    backend().launch(AddBackward{.da = da, .db = dc, .dout = dy, .accumulate_a = false, .accumulate_b = true});
    Vec ref_sum(N * C), ref_dc(N * C), av = to_vec(a), cv = to_vec(c), dyv = to_vec(dy);
    for (int64_t i = 0; i < N * C; ++i) {
      ref_sum[i] = av[i] + cv[i];
      ref_dc[i] = 0.5 + dyv[i];
    }
    check(to_vec(sum), ref_sum, "add out");
    check(to_vec(da), dyv, "add da (assigned)");
    check(to_vec(dc), ref_dc, "add db (accumulated)");
  }
}

// Matmul with bf16 operands (f32 accumulation), where the backend has it (the gradients where it
// also trains in bf16; decoding needs only the forward): the linear layers'
// case (GELU and bias, bf16 output, GELU slope and gradients) and the tied lm_head's
// (transposed weight, f32 logits and logit gradients, dx accumulated). Inputs are rounded to bf16
// and the float64 reference runs on the rounded values, so what remains is the kernel's own
// error: rounding its outputs, the pre-activation and the GELU slope saved from it, and the bf16
// copy of the output gradient it multiplies with (each <= u = eps/2 per element, independent):
// bound 2 eps norm-wise (the bias gradient, summed in f32 from the rounded slope, too).
TEST_P(OpsTest, MatmulWithBf16Operands) {
  if (!backend().supports(KernelOp::matmul_forward, DType::bf16)) {
    GTEST_SKIP() << backend().name() << " has no bf16 matmul";
  }
  if (!backend().supports(KernelOp::matmul_backward, DType::bf16)) {
    std::printf("  forward only: %s has no bf16 training GEMMs on this CPU (no AVX512_BF16 or AMX)\n",
                backend().name().c_str());
  }
  const double epsilon = 0x1.0p-7;
  auto check = [&](const Vec& actual, const Vec& expected, double bound, const char* what) {
    double error = testing::relative_error(actual, expected);
    std::printf("  bf16 %-34s rel err %.3e (bound %.3e)\n", what, error, bound);
    EXPECT_LE(error, bound) << what;
  };
  const int64_t C = d.C, OC = 3 * d.C + 1;
  // 150 rows: three passes of the streaming kernel where the CPU has no bf16 arithmetic.
  for (int64_t N : {d.B * d.T, int64_t{3}, int64_t{150}})
  for (bool lm_head : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << N << (lm_head ? " lm_head" : " linear with GELU"));
    const DType out_dtype = lm_head ? DType::f32 : DType::bf16;
    const Shape w_shape = lm_head ? Shape{OC, C} : Shape{C, OC};
    Tensor x = to_bf16(random_vector(rng, N * C), {N, C}), w = to_bf16(random_vector(rng, C * OC, 0.2), w_shape);
    Vec b = random_vector(rng, OC);
    Tensor out = zeros({N, OC}, out_dtype), slope = lm_head ? Tensor() : zeros({N, OC}, DType::bf16);
    const WeightLayout layout = lm_head ? WeightLayout::out_in : WeightLayout::in_out;
    backend().launch(MatmulForward{.out = out,
                                   .gelu_slope = slope,
                                   .inp = x,
                                   .weight = w,
                                   .bias = lm_head ? Tensor() : put(b, {OC}),
                                   .layout = layout,
                                   .gelu = !lm_head});
    const Vec xv = values(x), wv = values(w);
    Vec ref_out;
    reference::matmul_forward(ref_out, xv, wv, lm_head ? nullptr : &b, N, C, OC, lm_head, !lm_head);
    check(values(out), ref_out, lm_head ? testing::f32_tolerance(C) : 2 * epsilon, "out");
    if (!backend().supports(KernelOp::matmul_backward, DType::bf16)) continue;  // decoding only: said above
    Vec dx_start = lm_head ? values(to_bf16(random_vector(rng, N * C), {N, C})) : Vec(N * C, 0.0);
    Tensor dx = lm_head ? to_bf16(dx_start, {N, C}) : zeros({N, C}, DType::bf16);
    Tensor dout = lm_head ? put(random_vector(rng, N * OC), {N, OC}) : to_bf16(random_vector(rng, N * OC), {N, OC});
    Tensor dw = zeros(w_shape, DType::bf16), db = lm_head ? Tensor() : zeros({OC});
    const Vec dout_values = values(dout);
    backend().launch(MatmulBackward{.dinp = dx,
                                    .dweight = dw,
                                    .dbias = db,
                                    .dout = dout,
                                    .inp = x,
                                    .weight = w,
                                    .gelu_slope = slope,
                                    .layout = layout,
                                    .gelu = !lm_head,
                                    .accumulate_dinp = lm_head,
                                    .accumulate_dweight = false});
    Vec ref_dx = dx_start, ref_dw(C * OC), ref_db(OC);
    reference::matmul_backward(ref_dx, ref_dw, &ref_db, dout_values, xv, wv, lm_head ? nullptr : &b, N, C, OC, lm_head,
                               !lm_head);
    check(values(dx), ref_dx, 2 * epsilon, lm_head ? "dx (accumulated)" : "dx");
    check(values(dw), ref_dw, 2 * epsilon, "dweight");
    if (!lm_head) check(get(db), ref_db, 2 * epsilon, "dbias");
  }
}

TEST_P(OpsTest, AdamWMatchesClosedForm) {
  // One step from m = v = 0: the update is lr·g/(|g|+eps·...) exactly, a hand-checkable value.
  const int64_t n = 5;
  Vec p0 = {1.0, -2.0, 0.5, 3.0, 0.0}, g = {0.1, -0.2, 0.0, 4.0, -1e-3};
  Tensor param = put(p0, {n});
  backend().launch(AdamWUpdate{.param = param,
                               .grad = put(g, {n}),
                               .m = zeros({n}),
                               .v = zeros({n}),
                               .params = {0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}});
  Vec expected(n);
  for (int64_t i = 0; i < n; ++i) {
    double mhat = g[i], vhat = g[i] * g[i];  // bias correction undoes the (1-beta) factors at step 1
    expected[i] = p0[i] * (1 - 0.01 * 0.1) - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
  }
  EXPECT_CLOSE(get(param), expected, 4, "adamw step 1");
}

// The clip factor goes into the update, not into the gradient buffer: the moments of step 1 are
// (1 - beta) times the scaled gradient (and its square), and the buffer still holds the original.
TEST_P(OpsTest, AdamWScalesTheGradientItReads) {
  const int64_t n = 5;
  const double factor = 0.25;
  Vec g = {0.1, -0.2, 0.0, 4.0, -1e-3};
  Tensor grad = put(g, {n}), m = zeros({n}), v = zeros({n});
  backend().launch(AdamWUpdate{.param = put(Vec(n, 1.0), {n}),
                               .grad = grad,
                               .m = m,
                               .v = v,
                               .params = {0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, static_cast<float>(factor)}});
  Vec expected_m(n), expected_v(n);
  for (int64_t i = 0; i < n; ++i) {
    expected_m[i] = (1 - 0.9) * factor * g[i];
    expected_v[i] = (1 - 0.95) * factor * g[i] * factor * g[i];
  }
  EXPECT_CLOSE(get(m), expected_m, 2, "first moment");
  EXPECT_CLOSE(get(v), expected_v, 2, "second moment");
  EXPECT_CLOSE(get(grad), g, 1, "gradient buffer");
}

TEST_P(OpsTest, SumSquaresIsExactInDouble) {
  const int64_t n = 100003;
  Vec x = random_vector(rng, n);
  Tensor x_t = put(x, {n});
  double expected = 0;
  for (double value : get(x_t)) expected += value * value;
  double result = 0;
  backend().launch(SumSquares{.x = x_t, .result = &result});
  EXPECT_NEAR(result, expected, expected * 1e-12);
}

TEST_P(OpsTest, MissingKernelNamesKernelDeviceAndDtype) {
  // No backend multiplies f16 matrices on a CPU without fp16 arithmetic; the message says what is missing.
  Tensor x = zeros({2, 3}, DType::f16), w = zeros({3, 4}, DType::f16);
  if (backend().supports(KernelOp::matmul_forward, DType::f16)) GTEST_SKIP() << "this backend has an f16 matmul";
  try {
    backend().launch(MatmulForward{.out = zeros({2, 4}), .inp = x, .weight = w});
    FAIL() << "launch without a kernel did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("backend '{}' has no matmul_forward kernel for f16 on cpu", backend().name()));
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, OpsTest,
                         ::testing::ValuesIn(testing::backends_with_opaque()),
                         [](const auto& info) { return info.param->name(); });

TEST(OpaqueBackend, RefusesHostAccessAndNamesTheWayOut) {
  Tensor tensor = testing::opaque_backend().empty({2, 3}, DType::f32);
  try {
    tensor.data<float>();
    FAIL() << "host access to opaque memory did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("download/upload"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tensor.raw(), Error);
  std::vector<float> values{1, 2, 3, 4, 5, 6};
  testing::opaque_backend().upload(values.data(), tensor);
  EXPECT_EQ(testing::opaque_backend().download<float>(tensor), values);
}

}  // namespace
}  // namespace paraflow
