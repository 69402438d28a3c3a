// Rows in blocks for kernels that keep a block's accumulators in registers (the half products,
// the bf16 pair products): the block's row count a compile-time constant.
#pragma once

#include <cstdint>

namespace paraflow::cpu {

constexpr int kMaxBlockRows = 8;

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

}  // namespace paraflow::cpu
