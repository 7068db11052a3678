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
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k0 = 0; k0 < p.k; k0 += 64) {
          _tile_loadd(4, a0 + k0 * 16, 64);
          _tile_loadd(6, b0 + k0 * 16, 64);
          _tile_dpbssd(0, 4, 6);
          if (pairs == 2) {
            _tile_loadd(7, b1 + k0 * 16, 64);
            _tile_dpbssd(1, 4, 7);
          }
          if (two_row_tiles) {
            _tile_loadd(5, a1 + k0 * 16, 64);
            _tile_dpbssd(2, 5, 6);
            if (pairs == 2) _tile_dpbssd(3, 5, 7);
          }
        }
        _tile_stored(0, sums[0], 64);
        _tile_stored(1, sums[1], 64);
        _tile_stored(2, sums[2], 64);
        _tile_stored(3, sums[3], 64);
        for (int j = 0; j < pairs; ++j) {
          __m512 scale = _mm512_castsi512_ps(load_pair(first[j], second[j], kTileRows * p.k));
          int64_t col = (t + 2 * j) * kTileRows;
          int64_t in_block = (tiles - 2 * j < 2 ? tiles - 2 * j : 2) * kTileRows;
          int valid = static_cast<int>(p.n - col < in_block ? p.n - col : in_block);
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
  if (full_rows < p.m) {
    W8A8Problem rest = p;
    rest.q += full_rows * p.k;
    rest.x_scale += full_rows;
    rest.x_sum += full_rows;
    rest.out = static_cast<char*>(p.out) + full_rows * p.n * (p.out_dtype == DType::f32 ? 4 : 2);
    rest.m = p.m - full_rows;
    avx512vnni::w8a8_tiles(rest, tile_begin, tile_end);
  }
}

}  // namespace shrike::amx
