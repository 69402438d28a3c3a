// Register blocks for the outer-product kernels (the half products, the bf16 pair products):
// up to 8 input rows by 3 groups of 16 weight rows, 24 accumulators, three weight registers and a
// broadcast in the 32 registers; per column pair three loads and eight broadcasts feed 24
// multiply-adds. 6 x 4 and 4 x 6 ran at 0.6x and 0.3x of its rate (bench/RESULTS.md, float16).
// The block's sizes are compile-time constants.
#pragma once

#include <algorithm>
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

// Which lines of the next weights (`next`, `bytes` long; null where there are none) the pass of row
// block `row_block` of for_each_row_block(rows) brings into the caches (the tile products ask for
// L1: on a Zen 5, batch-1 Q8_0 decoding ran ~10% faster than with L2 as the target, a step of 28
// rows ~7%), `lines_per_step` at each of its `steps` steps: the first row block waits on the
// current weights' stream from memory, the others read them from the caches at the arithmetic's
// pace, so they share the next weights' lines between them; where one block takes all the rows
// (batch-1 decoding), it brings them all, a group ahead of its own stream, which the hardware
// prefetcher does not follow across a tiled group's parts. Null where this block brings none.
struct NextWeightsShare {
  const char* first_line = nullptr;
  int64_t lines_per_step = 0;
};
inline NextWeightsShare next_weights_share(const void* next, int64_t bytes, int64_t rows, int64_t row_block,
                                           int64_t steps) {
  constexpr int64_t kLine = 64;
  const int64_t row_blocks = (rows + kMaxBlockRows - 1) / kMaxBlockRows;
  if (next == nullptr || (row_block == 0 && row_blocks > 1)) return {};
  const int64_t lines = (bytes + kLine - 1) / kLine;
  const int64_t sharing = std::max<int64_t>(1, row_blocks - 1);
  const int64_t share = (lines + sharing - 1) / sharing;
  const int64_t first = std::max<int64_t>(0, row_block - 1) * share;
  if (first >= lines) return {};
  return {static_cast<const char*>(next) + first * kLine, (std::min(share, lines - first) + steps - 1) / steps};
}

}  // namespace paraflow::cpu
