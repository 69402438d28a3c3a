#include "backend/cpu/amx_tiles.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "base/error.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#define PARAFLOW_HAVE_AMX 1
#endif

namespace paraflow::cpu {

bool amx_tiles_available() {
#ifdef PARAFLOW_HAVE_AMX
  // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
  static const bool granted = __builtin_cpu_supports("amx-bf16") && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
#else
  return false;
#endif
}

#ifdef PARAFLOW_HAVE_AMX
namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-1: two blocks of input rows (A, first_rows and second_rows of 32 columns); 2-3: two
// groups of 16 outputs (B, a 1 KiB weight tile each); 4-7: their products, 4 + group + 2 * block
// ([input row][output], the block's rows). A block of fewer than 16 rows is a shorter tile, so
// nothing past the last row is read or written.
void configure_tiles(int first_rows, int second_rows) {
  TileConfig config;
  const int rows[8] = {first_rows, second_rows, 16, 16, first_rows, first_rows, second_rows, second_rows};
  for (int tile = 0; tile < 8; ++tile) {
    config.bytes_per_row[tile] = 64;
    config.rows[tile] = static_cast<uint8_t>(std::max(rows[tile], 1));
  }
  _tile_loadconfig(&config);
}

// BLOCKS blocks of input rows (x the first's first row) times GROUPS groups of 16 outputs (w the
// first group's start): each tile loaded serves every tile of the other side, and the two to four
// products accumulate side by side, so that no tile product waits for the one before it. Every
// sum still adds the same 32-column chunks in order. `next` (or null) is the next pair of groups,
// asked into L2 a chunk at a time while this pair is multiplied: a tile load that misses to DRAM
// holds up the products queued behind it (the 124M shape's linear layers in a 32-sequence decode
// step: 7.34-7.41 -> 7.00-7.09 ms; into L1 instead it was slower, 7.9-8.1).
template <int BLOCKS, int GROUPS>
void tile_products(float* sums, int64_t sums_ld, const uint16_t* x, int64_t C, const uint16_t* w,
                   const uint16_t* next) {
  const int64_t chunks = C / 32, x_stride = C * 2, sums_stride = sums_ld * 4;
  const uint16_t* second_group = w + 16 * C;
  _tile_zero(4);
  if constexpr (GROUPS == 2) _tile_zero(5);
  if constexpr (BLOCKS == 2) _tile_zero(6);
  if constexpr (BLOCKS == 2 && GROUPS == 2) _tile_zero(7);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    if (next != nullptr) {
      for (int line = 0; line < 16 * GROUPS; ++line) {
        _mm_prefetch(reinterpret_cast<const char*>(next + chunk * 512 * GROUPS + line * 32), _MM_HINT_T1);
      }
    }
    _tile_loadd(0, x + chunk * 32, x_stride);
    if constexpr (BLOCKS == 2) _tile_loadd(1, x + 16 * C + chunk * 32, x_stride);
    _tile_loadd(2, w + chunk * 512, 64);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (BLOCKS == 2) _tile_dpbf16ps(6, 1, 2);
    if constexpr (GROUPS == 2) {
      _tile_loadd(3, second_group + chunk * 512, 64);
      _tile_dpbf16ps(5, 0, 3);
      if constexpr (BLOCKS == 2) _tile_dpbf16ps(7, 1, 3);
    }
  }
  _tile_stored(4, sums, sums_stride);
  if constexpr (GROUPS == 2) _tile_stored(5, sums + 16, sums_stride);
  if constexpr (BLOCKS == 2) _tile_stored(6, sums + 16 * sums_ld, sums_stride);
  if constexpr (BLOCKS == 2 && GROUPS == 2) _tile_stored(7, sums + 16 * sums_ld + 16, sums_stride);
}

template <int BLOCKS>
void tile_products_all_groups(float* sums, int64_t sums_ld, const uint16_t* x, int64_t C, const uint16_t* weight,
                              int64_t begin, int64_t end) {
  int64_t o = begin;
  for (; o + 32 <= end; o += 32) {
    const uint16_t* next = o + 64 <= end ? weight + (o + 32) * C : nullptr;
    tile_products<BLOCKS, 2>(sums + (o - begin), sums_ld, x, C, weight + o * C, next);
  }
  if (o < end) tile_products<BLOCKS, 1>(sums + (o - begin), sums_ld, x, C, weight + o * C, nullptr);
}

}  // namespace

void amx_tile_products(float* sums, int64_t sums_ld, const uint16_t* x, int64_t rows, int64_t columns,
                       const uint16_t* weight, int64_t begin, int64_t end) {
  // Two blocks of input rows at a time, the share's weight groups (in L2 after the first pass)
  // under them.
  for (int64_t first = 0; first < rows; first += 32) {
    const int first_rows = static_cast<int>(std::min<int64_t>(16, rows - first));
    const int second_rows = static_cast<int>(std::clamp<int64_t>(rows - first - 16, 0, 16));
    configure_tiles(first_rows, second_rows);
    const uint16_t* block = x + first * columns;
    float* block_sums = sums + first * sums_ld;
    if (second_rows > 0) tile_products_all_groups<2>(block_sums, sums_ld, block, columns, weight, begin, end);
    else tile_products_all_groups<1>(block_sums, sums_ld, block, columns, weight, begin, end);
  }
  _tile_release();
}
#else
void amx_tile_products(float*, int64_t, const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t) {
  throw Error("amx_tile_products: this build has no AMX code (check amx_tiles_available() first)");
}
#endif

}  // namespace paraflow::cpu
