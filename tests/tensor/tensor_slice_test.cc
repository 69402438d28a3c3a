// TensorSlice: TensorFlow's slice-spec text, overlaps, and box copies, against hand-computed values.
#include <gtest/gtest.h>

#include <numeric>

#include "base/error.h"
#include "tensor/tensor_slice.h"

namespace paraflow {
namespace {

TEST(TensorSlice, WritesAndReadsTensorFlowsSpec) {
  const Shape global{4, 6};
  const TensorSlice rows{{2, 0}, {2, 6}};
  EXPECT_EQ(rows.to_spec(global), "2,2:-");  // as TensorSlice::DebugString writes it
  EXPECT_EQ(TensorSlice::parse_spec("2,2:-", global, "test"), rows);
  EXPECT_EQ(TensorSlice::whole(global).to_spec(global), "-:-");
  EXPECT_EQ(TensorSlice::parse_spec("-:1,3", global, "test"), (TensorSlice{{0, 1}, {4, 3}}));
  EXPECT_EQ(TensorSlice::whole(Shape{}).to_spec(Shape{}), "");
}

TEST(TensorSlice, RefusesSpecsThatDoNotFitTheTensor) {
  const Shape global{4, 6};
  for (const char* bad : {"2,3:-", "1,2", "1,2:-:-", "a,2:-", "1:-", "1,2x:-", "-:-1,2"}) {
    try {
      TensorSlice::parse_spec(bad, global, "index.json tensor 'w'");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("index.json tensor 'w'"), std::string::npos) << e.what();
    }
  }
}

TEST(TensorSlice, IntersectsAndMoves) {
  const TensorSlice a{{0, 2}, {4, 4}}, b{{3, 5}, {3, 3}};
  EXPECT_EQ(a.intersect(b), (TensorSlice{{3, 5}, {1, 1}}));
  EXPECT_FALSE(a.intersect(TensorSlice{{0, 6}, {4, 2}}).has_value());  // touching is not overlapping
  EXPECT_EQ(b.moved({3, 5}, {0, 0}), (TensorSlice{{0, 0}, {3, 3}}));
}

TEST(TensorSlice, CopiesABoxBetweenBuffers) {
  // A 3x4 source holding 0..11; its box rows 1-2, columns 1-2 (5, 6, 9, 10) into a 2x5 target at (0, 3).
  std::vector<float> source(12), target(10, -1);
  std::iota(source.begin(), source.end(), 0.0f);
  copy_box(source.data(), Shape{3, 4}, {1, 1}, target.data(), Shape{2, 5}, {0, 3}, Shape{2, 2});
  EXPECT_EQ(target, (std::vector<float>{-1, -1, -1, 5, 6, -1, -1, -1, 9, 10}));
  // Three dimensions: the 2x2x2 corner of a 3x3x3 cube of 0..26.
  std::vector<float> cube(27), corner(8);
  std::iota(cube.begin(), cube.end(), 0.0f);
  copy_box(cube.data(), Shape{3, 3, 3}, {1, 1, 1}, corner.data(), Shape{2, 2, 2}, {0, 0, 0}, Shape{2, 2, 2});
  EXPECT_EQ(corner, (std::vector<float>{13, 14, 16, 17, 22, 23, 25, 26}));
  std::vector<float> row(3, 0);
  copy_box(source.data(), Shape{12}, {7}, row.data(), Shape{3}, {0}, Shape{3});
  EXPECT_EQ(row, (std::vector<float>{7, 8, 9}));
}

}  // namespace
}  // namespace paraflow
