// The decoding layout passes: in_out matmul weights become [out, in] values read with layout
// out_in, others stay; a graph run with the transposed weight gives the original's output. Then
// out_in weights become out_in_interleaved where the backend prefers it, and give the same output
// within f32's rounding.
#include <gtest/gtest.h>

#include "graph/executor.h"
#include "graph/weight_layout.h"
#include "test_util.h"

namespace paraflow {
namespace {

using graph::Attributes;
using graph::OpKind;
using graph::ValueId;
using graph::ValueRole;

TEST(WeightLayout, TransposesInOutMatmulWeightsOnlyAndKeepsTheResult) {
  const int64_t N = 3, C = 5, OC = 7;
  graph::Graph g;
  const ValueId x = g.add_value("x", Shape{N, C}, DType::f32, ValueRole::input);
  const ValueId w = g.add_value("w", Shape{C, OC}, DType::f32, ValueRole::parameter);      // [in, out]
  const ValueId head = g.add_value("head", Shape{OC, C}, DType::f32, ValueRole::parameter);  // already [out, in]
  const ValueId y = g.add_node(OpKind::matmul, "linear", {x, w}, Attributes().set("layout", 0))[0];
  const ValueId z = g.add_node(OpKind::matmul, "tied", {x, head}, Attributes().set("layout", 1))[0];

  Rng rng(testing::test_seed());
  std::vector<float> xs(N * C), ws(C * OC), heads(OC * C);
  for (auto* values : {&xs, &ws, &heads}) {
    for (float& value : *values) value = static_cast<float>(rng.normal());
  }
  auto run = [&](const std::vector<float>& weight, Shape weight_shape) {
    graph::Executor executor(g, cpu_backend());
    executor.bind(w, cpu_backend().upload(weight, std::move(weight_shape), DType::f32));
    executor.bind(head, cpu_backend().upload(heads, {OC, C}, DType::f32));
    executor.keep(y);
    executor.keep(z);
    cpu_backend().upload(xs.data(), executor.tensor(x));
    executor.forward();
    return std::pair{cpu_backend().download<float>(executor.tensor(y)), cpu_backend().download<float>(executor.tensor(z))};
  };
  const auto [y_before, z_before] = run(ws, {C, OC});

  EXPECT_EQ(graph::transpose_matmul_weights(g, {w, head, x}), std::vector<ValueId>{w});
  EXPECT_EQ(g.value(w).shape, (Shape{OC, C}));
  EXPECT_EQ(g.value(head).shape, (Shape{OC, C}));
  EXPECT_EQ(g.nodes()[0].attributes.get("layout"), 1);
  std::vector<float> transposed(ws.size());
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t o = 0; o < OC; ++o) transposed[o * C + c] = ws[c * OC + o];
  }
  const auto [y_after, z_after] = run(transposed, {OC, C});
  // Both layouts multiply the same numbers, summed in possibly another order: f32's bound over C terms.
  const std::vector<double> before(y_before.begin(), y_before.end()), after(y_after.begin(), y_after.end());
  EXPECT_CLOSE(after, before, C, "linear output, weight transposed");
  EXPECT_EQ(z_after, z_before);
}

TEST(WeightLayout, InterleavesOnlyWeightsEveryReaderOfWhichTheBackendPrefersSo) {
  const int64_t N = 5, C = 15, OC = 19, V = 19;  // one group of 16 rows, then three
  graph::Graph g;
  const ValueId x = g.add_value("x", Shape{N, C}, DType::f32, ValueRole::input);
  const ValueId tokens = g.add_value("tokens", Shape{1, N}, DType::i32, ValueRole::input);
  const ValueId w = g.add_value("w", Shape{OC, C}, DType::f32, ValueRole::parameter);
  const ValueId table = g.add_value("table", Shape{V, C}, DType::f32, ValueRole::parameter);  // also embedded
  const ValueId v = g.add_value("v", Shape{C, OC}, DType::f32, ValueRole::parameter);        // read in_out
  const ValueId wpe = g.add_value("wpe", Shape{N, C}, DType::f32, ValueRole::parameter);
  const Attributes out_in = Attributes().set("layout", static_cast<int64_t>(WeightLayout::out_in)).set("row_invariant", 1);
  const ValueId y = g.add_node(OpKind::matmul, "linear", {x, w}, out_in)[0];
  const ValueId embedded = g.add_node(OpKind::embedding, "embed", {tokens, table, wpe})[0];
  g.add_node(OpKind::matmul, "head matmul", {embedded, table}, out_in);
  g.add_node(OpKind::matmul, "in_out matmul", {x, v}, Attributes().set("layout", static_cast<int64_t>(WeightLayout::in_out)));

  const bool prefers = cpu_backend().prefers_interleaved_weights(DType::f32);
  Rng rng(testing::test_seed());
  std::vector<float> xs(N * C), ws(OC * C), table_values(V * C), wpe_values(N * C);
  for (auto* values : {&xs, &ws, &table_values, &wpe_values}) {
    for (float& value : *values) value = static_cast<float>(rng.normal());
  }
  const std::vector<int32_t> token_ids{0, 17, 5, 18, 15};  // rows of the group and after it
  auto run = [&](const std::vector<float>& weight, const std::vector<float>& table_stored) {
    graph::Executor executor(g, cpu_backend());
    executor.bind(w, cpu_backend().upload(weight, {OC, C}, DType::f32));
    executor.bind(table, cpu_backend().upload(table_stored, {V, C}, DType::f32));
    executor.bind(v, cpu_backend().empty({C, OC}, DType::f32));
    executor.bind(wpe, cpu_backend().upload(wpe_values, {N, C}, DType::f32));
    executor.keep(y);
    executor.keep(embedded);
    cpu_backend().upload(xs.data(), executor.tensor(x));
    cpu_backend().upload(token_ids.data(), executor.tensor(tokens));
    executor.forward();
    return std::pair{cpu_backend().download<float>(executor.tensor(y)),
                     cpu_backend().download<float>(executor.tensor(embedded))};
  };
  const auto [y_before, embedded_before] = run(ws, table_values);

  const std::vector<ValueId> changed = graph::interleave_weights(g, {w, table, v, x}, cpu_backend());
  if (!prefers) {  // this CPU's kernels read no interleaved weights: nothing may change
    EXPECT_TRUE(changed.empty());
    return;
  }
  EXPECT_EQ(changed, (std::vector<ValueId>{w, table}));
  EXPECT_EQ(g.value(w).shape, (Shape{OC, C}));
  for (const char* name : {"linear", "embed", "head"}) {
    for (const graph::Node& node : g.nodes()) {
      if (node.name == name) {
        EXPECT_EQ(node.attributes.get("layout"), static_cast<int64_t>(WeightLayout::out_in_interleaved)) << name;
      }
    }
  }
  const auto [y_after, embedded_after] =
      run(testing::arranged(ws, OC, C, interleaved_offset), testing::arranged(table_values, V, C, interleaved_offset));
  // The same products, each output summed in another order: f32's bound over C terms.
  EXPECT_CLOSE(std::vector<double>(y_after.begin(), y_after.end()), std::vector<double>(y_before.begin(), y_before.end()),
               C, "linear output, weight interleaved");
  // The embedding gathers the same rows: the same sums, bit for bit.
  EXPECT_EQ(embedded_after, embedded_before);
}

// Hand-placed: an [OC = 18, C = 3] weight holds one group of 16 rows, column by column, then
// two rows as in out_in.
TEST(WeightLayout, InterleavedOffsetsPlaceAGroupsRowsColumnByColumn) {
  EXPECT_EQ(interleaved_offset(0, 0, 18, 3), 0);
  EXPECT_EQ(interleaved_offset(1, 0, 18, 3), 1);
  EXPECT_EQ(interleaved_offset(15, 0, 18, 3), 15);
  EXPECT_EQ(interleaved_offset(0, 1, 18, 3), 16);
  EXPECT_EQ(interleaved_offset(3, 2, 18, 3), 35);
  EXPECT_EQ(interleaved_offset(15, 2, 18, 3), 47);
  EXPECT_EQ(interleaved_offset(16, 0, 18, 3), 48);
  EXPECT_EQ(interleaved_offset(17, 2, 18, 3), 53);
}

// Hand-placed: an [OC = 18, C = 64] weight holds one group of 16 rows as two 1 KiB tiles of
// column pairs (a pair's two values side by side per row), then two rows as in out_in.
TEST(WeightLayout, TilesOffsetsPlaceAGroupsRowsAsColumnPairs) {
  struct Place {
    int64_t row, column, offset;
  };
  for (const Place& place : {Place{0, 0, 0}, Place{0, 1, 1}, Place{1, 0, 2}, Place{15, 1, 31}, Place{0, 2, 32},
                             Place{3, 5, 71}, Place{0, 32, 512}, Place{15, 63, 1023}, Place{16, 0, 1024},
                             Place{17, 63, 1151}}) {
    EXPECT_EQ(tiles_offset(place.row, place.column, 18, 64), place.offset) << place.row << ", " << place.column;
  }
}

// Only bf16 weights that out_in matmuls alone read, in whole tiles of 32 columns, become
// out_in_tiles, and only where the backend prefers that; the rest keep their layouts.
TEST(WeightLayout, TilesOnlyWholeTileWeightsOfOutInMatmuls) {
  const int64_t N = 4, V = 40;
  graph::Graph g;
  auto value = [&](const char* name, Shape shape, DType dtype, ValueRole role) {
    return g.add_value(name, std::move(shape), dtype, role);
  };
  const ValueId x = value("x", Shape{N, 64}, DType::bf16, ValueRole::input);
  const ValueId x48 = value("x48", Shape{N, 48}, DType::bf16, ValueRole::input);
  const ValueId w = value("w", Shape{19, 64}, DType::bf16, ValueRole::parameter);
  const ValueId narrow = value("narrow", Shape{19, 48}, DType::bf16, ValueRole::parameter);  // 1.5 tiles
  const ValueId v = value("v", Shape{64, 19}, DType::bf16, ValueRole::parameter);          // read in_out
  const ValueId f32 = value("f32", Shape{19, 64}, DType::f32, ValueRole::parameter);
  const ValueId tokens = value("tokens", Shape{1, N}, DType::i32, ValueRole::input);
  const ValueId table = value("table", Shape{V, 64}, DType::bf16, ValueRole::parameter);  // also embedded
  const ValueId wpe = value("wpe", Shape{N, 64}, DType::f32, ValueRole::parameter);
  const Attributes out_in = Attributes().set("layout", static_cast<int64_t>(WeightLayout::out_in));
  g.add_node(OpKind::matmul, "tiled matmul", {x, w}, out_in);
  g.add_node(OpKind::matmul, "narrow matmul", {x48, narrow}, out_in);
  g.add_node(OpKind::matmul, "in_out matmul", {x, v}, Attributes().set("layout", static_cast<int64_t>(WeightLayout::in_out)));
  g.add_node(OpKind::matmul, "f32 matmul", {x, f32}, out_in);
  const ValueId embedded = g.add_node(OpKind::embedding, "embed", {tokens, table, wpe})[0];
  g.add_node(OpKind::matmul, "head matmul", {embedded, table}, out_in);

  const std::vector<ValueId> changed = graph::tile_weights(g, {w, narrow, v, f32, table}, cpu_backend());
  const bool prefers = cpu_backend().prefers_tiled_weights(DType::bf16);
  EXPECT_EQ(changed, prefers ? std::vector<ValueId>{w} : std::vector<ValueId>{});
  for (const graph::Node& node : g.nodes()) {
    if (node.name == "embed" || node.name == "in_out matmul") continue;  // not out_in matmuls: as they were
    const WeightLayout expected = prefers && node.name == "tiled matmul" ? WeightLayout::out_in_tiles : WeightLayout::out_in;
    EXPECT_EQ(node.attributes.get("layout", 0), static_cast<int64_t>(expected)) << node.name;
  }
  EXPECT_FALSE(cpu_backend().prefers_tiled_weights(DType::f32));
}

}  // namespace
}  // namespace paraflow
