// Register blocks for the outer-product kernels (the half products, the bf16 pair products):
// up to 8 input rows by 3 groups of 16 weight rows, 24 accumulators, three weight registers and a
// broadcast in the 32 registers; per column pair three loads and eight broadcasts feed 24
// multiply-adds. 6 x 4 and 4 x 6 ran at 0.6x and 0.3x of its rate (bench/RESULTS.md, float16).
// The block's sizes are compile-time constants.
#pragma once

#include <cstdint>

namespace paraflow::cpu {

constexpr int kMaxBlockRows = 8, kMaxBlockGroups = 3;

// The rows [0, rows) in blocks of at most kMaxBlockRows, as even in size as can be (17 rows: 6,
// 6, 5), each handed to block.template operator()<R>(first) with R its row count.
template <typename Block>
void for_each_row_block(int64_t rows, Block&& block) {
  const int64_t blocks = (rows + kMaxBlockRows - 1) / kMaxBlockRows;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = rows * b / blocks;
    switch (rows * (b + 1) / blocks - first) {
      case 8: block.template operator()<8>(first); break;
      case 7: block.template operator()<7>(first); break;
      case 6: block.template operator()<6>(first); break;
      case 5: block.template operator()<5>(first); break;
      case 4: block.template operator()<4>(first); break;
      case 3: block.template operator()<3>(first); break;
      case 2: block.template operator()<2>(first); break;
      default: block.template operator()<1>(first); break;
    }
  }
}

// The groups [0, groups) in blocks of kMaxBlockGroups, then the one or two left, each handed to
// block.template operator()<P>(first) with P its group count.
template <typename Block>
void for_each_group_block(int64_t groups, Block&& block) {
  int64_t g = 0;
  for (; g + kMaxBlockGroups <= groups; g += kMaxBlockGroups) block.template operator()<kMaxBlockGroups>(g);
  if (groups - g == 2) block.template operator()<2>(g);
  if (groups - g == 1) block.template operator()<1>(g);
}

}  // namespace paraflow::cpu
