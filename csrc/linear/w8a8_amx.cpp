// W8A8 prefill on the AMX tile unit. tdpbssd multiplies signed int8 activations by signed int8
// weights into exact int32 sums, 16 rows x 16 columns x 64 K per instruction, so the integer
// sums equal the reference's and the float steps after them are the AVX-512 kernel's.
// Rows are taken 32 at a time (two activation tiles) against 32 columns (two weight tiles),
// four accumulator tiles in all; rows past the last multiple of 16 go to the AVX-512 kernel.
// Activations come packed as whole tiles (W8A8Problem::q_tiles, see linear.cpp).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "linear/amx_tiles.h"
#include "linear/epilogue_avx512.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::amx {

namespace {
using avx512vnni::load_bias;
using avx512vnni::load_pair;
using avx512vnni::store_row;

// Two adjacent packed tiles as tdpbssd's weight operand, (K/4, 16, 4): the packed layout keeps
// each tile as (K/4, 8, 4), so a row of the operand is 32 bytes from each tile.
void gather_pair(const uint8_t* first, const uint8_t* second, int64_t k, int8_t* panel) {
  for (int64_t kk = 0; kk < k / 4; ++kk) {
    std::memcpy(panel + kk * 64, first + kk * 32, 32);
    std::memcpy(panel + kk * 64 + 32, second + kk * 32, 32);
  }
}

}  // namespace

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  const int64_t full_rows = p.m / 16 * 16, tile_bytes = w8a8_tile_bytes(p.k);
  if (full_rows > 0) {
    configure_tiles();
    thread_local std::vector<int8_t> panel;  // (2, K/4, 16, 4): the block's two column pairs
    panel.resize(2 * 16 * p.k);
    alignas(64) int32_t sums[4][16][16];  // accumulator tile (row tile * 2 + pair), (row, column)
    for (int64_t t = tile_begin; t < tile_end; t += kBlockTiles) {
      const int64_t tiles = tile_end - t < kBlockTiles ? tile_end - t : kBlockTiles;
      const int pairs = static_cast<int>((tiles + 1) / 2);
      const uint8_t* first[2];
      const uint8_t* second[2];
      for (int j = 0; j < pairs; ++j) {
        first[j] = p.packed + (t + 2 * j) * tile_bytes;
        second[j] = p.packed + (t + (2 * j + 1 < tiles ? 2 * j + 1 : 2 * j)) * tile_bytes;
        gather_pair(first[j], second[j], p.k, panel.data() + j * 16 * p.k);
      }
      const int8_t* b0 = panel.data();
      const int8_t* b1 = panel.data() + 16 * p.k;
      for (int64_t i0 = 0; i0 < full_rows; i0 += 32) {
        const bool two_row_tiles = full_rows - i0 >= 32;
        const int8_t* a0 = p.q_tiles + i0 * p.k;  // activation tiles of rows i0.. and i0 + 16..
        const int8_t* a1 = a0 + 16 * p.k;
        multiply_block(a0, a1, b0, b1, 0, p.k, two_row_tiles, pairs == 2, sums);
        for (int j = 0; j < pairs; ++j) {
          __m512 scale = _mm512_castsi512_ps(load_pair(first[j], second[j], kTileRows * p.k));
          int64_t col;
          int valid = pair_columns(p.n, t, tiles, j, col);
          __m512 bias = load_bias(p.bias, col, valid);
          for (int r = 0; r < (two_row_tiles ? 32 : 16); ++r) {
            int64_t i = i0 + r;
            __m512i isum = _mm512_load_si512(sums[(r / 16) * 2 + j][r % 16]);
            __m512 combined = _mm512_mul_ps(_mm512_set1_ps(p.x_scale[i]), scale);
            __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), combined, bias);
            store_row(p.out, p.out_dtype, i * p.n + col, y, valid);
          }
        }
      }
    }
    _tile_release();
  }
  if (full_rows < p.m) avx512vnni::w8a8_tiles(rows_from(p, full_rows), tile_begin, tile_end);
}

}  // namespace shrike::amx
