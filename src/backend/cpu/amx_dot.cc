#include "backend/cpu/amx_dot.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "base/error.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#define PARAFLOW_HAVE_AMX 1
#endif

namespace paraflow::cpu {

bool amx_dot_available() {
#ifdef PARAFLOW_HAVE_AMX
  // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
  static const bool granted = __builtin_cpu_supports("amx-bf16") && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
#else
  return false;
#endif
}

AmxRows pack_amx_rows(const uint16_t* x, int64_t rows, int64_t columns) {
  AmxRows out{.rows = rows, .columns = columns, .row_blocks = (rows + 15) / 16};
  const int64_t chunks = columns / 32;
  out.packed.assign(static_cast<size_t>(chunks * out.row_blocks * 16 * 16 * 2), 0);
  // packed[chunk][row block][pair p][row j][t] = x[row block * 16 + j][chunk * 32 + 2p + t]
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t block = n / 16, j = n % 16;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      uint16_t* tile = out.packed.data() + (chunk * out.row_blocks + block) * 512;
      const uint16_t* source = x + n * columns + chunk * 32;
      for (int64_t p = 0; p < 16; ++p) {
        tile[(p * 16 + j) * 2] = source[2 * p];
        tile[(p * 16 + j) * 2 + 1] = source[2 * p + 1];
      }
    }
  }
  return out;
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

// Tiles: 0 a block of 16 weight rows, 1 and 2 two blocks of 16 input rows, 4 and 5 their sums.
void configure_tiles() {
  TileConfig config;
  for (int tile : {0, 1, 2, 4, 5}) {
    config.bytes_per_row[tile] = 64;
    config.rows[tile] = 16;
  }
  _tile_loadconfig(&config);
}

}  // namespace

void amx_dot_rows(float* sums, int64_t sums_ld, const AmxRows& x, const uint16_t* weight, int64_t begin, int64_t end) {
  configure_tiles();
  const int64_t C = x.columns, chunks = C / 32, stride = C * 2;
  alignas(64) float block[2][16][16];  // [input block][weight row][input row]
  for (int64_t o = begin; o < end; o += 16) {
    const uint16_t* w = weight + o * C;
    for (int64_t b = 0; b < x.row_blocks; b += 2) {
      const bool pair = b + 1 < x.row_blocks;
      _tile_zero(4);
      _tile_zero(5);
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const uint16_t* tiles = x.packed.data() + (chunk * x.row_blocks + b) * 512;
        _tile_loadd(0, w + chunk * 32, stride);
        _tile_loadd(1, tiles, 64);
        _tile_dpbf16ps(4, 0, 1);
        if (pair) {
          _tile_loadd(2, tiles + 512, 64);
          _tile_dpbf16ps(5, 0, 2);
        }
      }
      _tile_stored(4, block[0], 64);
      if (pair) _tile_stored(5, block[1], 64);
      for (int half = 0; half < (pair ? 2 : 1); ++half) {
        const int64_t first = (b + half) * 16, count = std::min<int64_t>(16, x.rows - first);
        for (int64_t j = 0; j < count; ++j) {
          float* row = sums + (first + j) * sums_ld + (o - begin);
          for (int64_t k = 0; k < 16; ++k) row[k] = block[half][k][j];
        }
      }
    }
  }
  _tile_release();
}
#else
void amx_dot_rows(float*, int64_t, const AmxRows&, const uint16_t*, int64_t, int64_t) {
  throw Error("amx_dot_rows: this build has no AMX code (check amx_dot_available() first)");
}
#endif

}  // namespace paraflow::cpu
