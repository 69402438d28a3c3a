// The decoding layout pass: in_out matmul weights become [out, in] values read with layout
// out_in, others stay; a graph run with the transposed weight gives the original's output.
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

}  // namespace
}  // namespace paraflow
