// The attention ops' shape checks: zero heads is refused by name in every form (the cached and
// paged ones divided by it: SIGFPE), as a head count that does not divide the width.
#include <gtest/gtest.h>

#include <tuple>

#include "base/error.h"
#include "graph/graph.h"

namespace paraflow {
namespace {

using graph::Attributes;
using graph::OpKind;
using graph::ValueId;
using graph::ValueRole;

TEST(AttentionOps, ZeroHeadsAreRefusedByName) {
  for (int64_t heads : {0, 5}) {
    graph::Graph g;
    const Attributes attributes = Attributes().set("n_head", heads).set_float("scale", 0.5);
    const ValueId qkv = g.add_value("qkv", Shape{2, 3, 24}, DType::f32, ValueRole::input);
    const ValueId row = g.add_value("row", Shape{2, 1, 24}, DType::f32, ValueRole::input);
    const ValueId cache = g.add_value("cache", Shape{2, 2, 8, 4}, DType::f32, ValueRole::input);
    const ValueId position = g.add_value("position", Shape{1}, DType::i32, ValueRole::input);
    const ValueId pool = g.add_value("pool", Shape{4, 2, 16, 4}, DType::f32, ValueRole::input);
    const ValueId positions = g.add_value("positions", Shape{2}, DType::i32, ValueRole::input);
    const ValueId tables = g.add_value("tables", Shape{2, 2}, DType::i32, ValueRole::input);
    const std::vector<std::tuple<OpKind, const char*, std::vector<ValueId>>> ops{
        {OpKind::attention, "attention", {qkv}},
        {OpKind::attention_cached, "attention_cached", {qkv, cache, cache, position}},
        {OpKind::attention_paged, "attention_paged", {row, pool, pool, positions, tables}}};
    for (const auto& [kind, name, inputs] : ops) {
      try {
        g.add_node(kind, name, inputs, attributes);
        ADD_FAILURE() << name << " accepted n_head " << heads;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace paraflow
