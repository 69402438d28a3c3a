#include "backend/quantized_tiles.h"

#include <cstring>
#include <vector>

#include "base/error.h"
#include "tensor/quantized.h"

namespace paraflow {

namespace {

// One group of 16 rows of `blocks` Q8_0 blocks each, from `rows` (out_in) into `group`.
void tile_q8_0_group(const BlockQ8_0* rows, uint8_t* group, int64_t blocks) {
  uint8_t* values = group;
  uint8_t* scales = group + kQuantizedTileRows * blocks * BlockQ8_0::kElements;
  for (int64_t r = 0; r < kQuantizedTileRows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockQ8_0& block = rows[r * blocks + b];
      std::memcpy(scales + (b * kQuantizedTileRows + r) * 2, &block.d, 2);
      for (int64_t s = 0; s < 8; ++s) {
        for (int64_t i = 0; i < 4; ++i) {
          values[((b * 8 + s) * kQuantizedTileRows + r) * 4 + i] = static_cast<uint8_t>(block.q[4 * s + i]) ^ 0x80;
        }
      }
    }
  }
}

// Q5_0: the low nibbles as the block holds them (byte i: weight i's, weight i + 16's), four
// bytes of each row per step; each step's top bits as a 64-bit mask, one bit per byte of the
// operand the kernel makes (bit 4 r + i: weight 4 k + i's of row r, for k 0-7); the scales.
void tile_q5_0_group(const BlockQ5_0* rows, uint8_t* group, int64_t blocks) {
  uint8_t* nibbles = group;
  uint8_t* masks = group + kQuantizedTileRows * blocks * 16;
  uint8_t* scales = group + kQuantizedTileRows * blocks * 20;
  std::memset(masks, 0, static_cast<size_t>(kQuantizedTileRows * blocks * 4));
  for (int64_t r = 0; r < kQuantizedTileRows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockQ5_0& block = rows[r * blocks + b];
      std::memcpy(scales + (b * kQuantizedTileRows + r) * 2, &block.d, 2);
      for (int64_t s = 0; s < 4; ++s) {
        std::memcpy(nibbles + ((b * 4 + s) * kQuantizedTileRows + r) * 4, block.qs + 4 * s, 4);
      }
      uint32_t top;
      std::memcpy(&top, block.qh, sizeof top);
      for (int64_t k = 0; k < 8; ++k) {
        for (int64_t i = 0; i < 4; ++i) {
          if ((top >> (4 * k + i)) & 1) {
            const int64_t bit = 4 * r + i;
            masks[(b * 8 + k) * 8 + bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
          }
        }
      }
    }
  }
}

void tile_q4_k_group(const BlockQ4_K* rows, uint8_t* group, int64_t blocks) {
  uint8_t* nibbles = group;
  uint8_t* heads = group + kQuantizedTileRows * blocks * 128;
  for (int64_t r = 0; r < kQuantizedTileRows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockQ4_K& block = rows[r * blocks + b];
      uint8_t* head = heads + b * 256;
      std::memcpy(head + 2 * r, &block.d, 2);
      std::memcpy(head + 32 + 2 * r, &block.dmin, 2);
      for (int64_t t = 0; t < 12; ++t) head[64 + 16 * t + r] = block.scales[t];
      for (int64_t p = 0; p < 4; ++p) {
        for (int64_t s = 0; s < 8; ++s) {
          std::memcpy(nibbles + (((b * 4 + p) * 8 + s) * kQuantizedTileRows + r) * 4, block.qs + 32 * p + 4 * s, 4);
        }
      }
    }
  }
}

}  // namespace

bool has_quantized_tiles(DType dtype) { return dtype == DType::q8_0 || dtype == DType::q5_0 || dtype == DType::q4_k; }

void tile_quantized_rows(DType dtype, void* data, int64_t rows, int64_t columns) {
  check(has_quantized_tiles(dtype), "tile_quantized_rows: {} weights have no out_in_tiles layout", dtype_name(dtype));
  check(columns % dtype_block_elements(dtype) == 0, "tile_quantized_rows: rows of {} are not whole {} blocks", columns,
        dtype_name(dtype));
  const int64_t blocks = columns / dtype_block_elements(dtype);
  const size_t group_bytes = dtype_bytes(dtype, kQuantizedTileRows * columns);
  std::vector<uint8_t> rows_of_group(group_bytes);
  for (int64_t g = 0; g < rows / kQuantizedTileRows; ++g) {
    uint8_t* group = static_cast<uint8_t*>(data) + static_cast<size_t>(g) * group_bytes;
    std::memcpy(rows_of_group.data(), group, group_bytes);
    switch (dtype) {
      case DType::q8_0: tile_q8_0_group(reinterpret_cast<const BlockQ8_0*>(rows_of_group.data()), group, blocks); break;
      case DType::q5_0: tile_q5_0_group(reinterpret_cast<const BlockQ5_0*>(rows_of_group.data()), group, blocks); break;
      default: tile_q4_k_group(reinterpret_cast<const BlockQ4_K*>(rows_of_group.data()), group, blocks); break;
    }
  }
}

}  // namespace paraflow
