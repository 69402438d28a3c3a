// The embedding op's backward pass takes the training form only: rows at positions 0..T-1. The
// decoding form (a positions input) is refused by name where it used to add each row's gradient
// to the position table's row t instead of its own position's.
#include <gtest/gtest.h>

#include "base/error.h"
#include "graph/autodiff.h"
#include "graph/executor.h"

namespace paraflow {
namespace {

using graph::ValueId;
using graph::ValueRole;

TEST(EmbeddingOp, BackwardRefusesThePositionsOfDecoding) {
  const int64_t T = 3, C = 4, V = 5, P = 8;
  graph::Graph g;
  const ValueId tokens = g.add_value("tokens", Shape{1, T}, DType::i32, ValueRole::input);
  const ValueId wte = g.add_value("wte", Shape{V, C}, DType::f32, ValueRole::parameter);
  const ValueId wpe = g.add_value("wpe", Shape{P, C}, DType::f32, ValueRole::parameter);
  const ValueId position = g.add_value("position", Shape{1}, DType::i32, ValueRole::input);
  const ValueId out = g.add_node(graph::OpKind::embedding, "embed", {tokens, wte, wpe, position})[0];
  graph::add_backward_pass(g, out);

  graph::Executor executor(g, cpu_backend());
  executor.bind(wte, cpu_backend().upload(std::vector<float>(V * C, 0.5f), {V, C}, DType::f32));
  executor.bind(wpe, cpu_backend().upload(std::vector<float>(P * C, 0.25f), {P, C}, DType::f32));
  for (ValueId parameter : {wte, wpe}) {
    executor.bind(g.value(parameter).grad, cpu_backend().empty(g.value(parameter).shape, DType::f32));
  }
  cpu_backend().upload(std::vector<int32_t>{1, 2, 3}.data(), executor.tensor(tokens));
  cpu_backend().upload(std::vector<int32_t>{4}.data(), executor.tensor(position));
  cpu_backend().upload(std::vector<float>(T * C, 1.0f).data(), executor.tensor(g.value(out).grad));
  executor.forward();
  try {
    executor.backward();
    ADD_FAILURE() << "a backward pass from position 4 ran";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("embedding backward: a positions input"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace paraflow
