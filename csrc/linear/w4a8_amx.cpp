// W4A8 prefill on the AMX tile unit. The nibbles of a block of 32 output columns are unpacked
// once per call to signed int8 weights (w, not w + 8) in tdpbssd's operand layout, so the tile
// unit gives sum(q * w) exactly; each group's sums are read out of the accumulator tiles and
// finished with the same float steps as the AVX-512 kernel (zero-point term, then the group
// scale). Blocks of 32 rows x 32 columns; rows past the last multiple of 16 go to the AVX-512
// kernel. Groups of 64 or 128 (whole 64-K activation tiles).
#include <immintrin.h>

#include <vector>

#include "linear/amx_tiles.h"
#include "linear/epilogue_avx512.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::amx {

namespace {
using avx512vnni::load_bias;
using avx512vnni::load_pair;
using avx512vnni::load_pair_i16;
using avx512vnni::store_row;

// Two adjacent packed tiles as signed weights in tdpbssd's operand layout (K/4, 16, 4), plus
// their per-group scales and weight sums as 16-lane float vectors, (groups, 16) each.
void unpack_pair(const W4A8Problem& p, const uint8_t* first, const uint8_t* second, int8_t* panel, float* scale,
                 float* wsum) {
  const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
  const int64_t groups = p.k / p.group;
  int64_t offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    // A packed step s holds K 8s..8s+3 in its low nibbles and 8s+4..8s+7 in its high ones:
    // operand rows 2s and 2s + 1.
    for (int64_t s = 0; s < p.group / 8; ++s, offset += 32, panel += 128) {
      __m512i v = load_pair(first, second, offset);
      _mm512_storeu_si512(panel, _mm512_sub_epi8(_mm512_and_si512(v, low4), eight));
      _mm512_storeu_si512(panel + 64, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight));
    }
    _mm512_storeu_ps(scale + g * 16, _mm512_castsi512_ps(load_pair(first, second, offset)));
    _mm512_storeu_ps(wsum + g * 16, _mm512_cvtepi32_ps(load_pair_i16(first, second, offset + 32)));
    offset += 48;
  }
}
}  // namespace

void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  const int64_t full_rows = p.m / 16 * 16, tile_bytes = w4a8_tile_bytes(p.k, p.group), groups = p.k / p.group;
  if (full_rows > 0) {
    configure_tiles();
    thread_local std::vector<int8_t> panel;  // (2, K/4, 16, 4): the block's two column pairs
    thread_local std::vector<float> scale, wsum;  // (2, groups, 16)
    panel.resize(2 * 16 * p.k);
    scale.resize(2 * groups * 16);
    wsum.resize(2 * groups * 16);
    alignas(64) int32_t sums[4][16][16];  // accumulator tile (row tile * 2 + pair), (row, column)
    alignas(64) float acc[32][2][16];     // (row, pair, column)
    for (int64_t t = tile_begin; t < tile_end; t += kBlockTiles) {
      const int64_t tiles = tile_end - t < kBlockTiles ? tile_end - t : kBlockTiles;
      const int pairs = static_cast<int>((tiles + 1) / 2);
      for (int j = 0; j < pairs; ++j) {
        const uint8_t* first = p.packed + (t + 2 * j) * tile_bytes;
        const uint8_t* second = p.packed + (t + (2 * j + 1 < tiles ? 2 * j + 1 : 2 * j)) * tile_bytes;
        unpack_pair(p, first, second, panel.data() + j * 16 * p.k, scale.data() + j * groups * 16,
                    wsum.data() + j * groups * 16);
      }
      const int8_t* b0 = panel.data();
      const int8_t* b1 = panel.data() + 16 * p.k;
      for (int64_t i0 = 0; i0 < full_rows; i0 += 32) {
        const bool two_row_tiles = full_rows - i0 >= 32;
        const int rows = two_row_tiles ? 32 : 16;
        const int8_t* a0 = p.q_tiles + i0 * p.k;  // activation tiles of rows i0.. and i0 + 16..
        const int8_t* a1 = a0 + 16 * p.k;
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < 2; ++j) _mm512_store_ps(acc[r][j], _mm512_setzero_ps());
        for (int64_t g = 0; g < groups; ++g) {
          multiply_block(a0, a1, b0, b1, g * p.group, (g + 1) * p.group, two_row_tiles, pairs == 2, sums);
          for (int j = 0; j < pairs; ++j) {
            __m512 group_scale = _mm512_loadu_ps(scale.data() + (j * groups + g) * 16);
            __m512 group_wsum = _mm512_loadu_ps(wsum.data() + (j * groups + g) * 16);
            for (int r = 0; r < rows; ++r) {
              // sum((q - zero) * w) = sum(q * w) - zero * sum(w), exact in float for groups up
              // to 128 (see tile_walk_x86.h).
              __m512i isum = _mm512_load_si512(sums[(r / 16) * 2 + j][r % 16]);
              __m512 exact = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(p.x_zero[i0 + r])), group_wsum,
                                              _mm512_cvtepi32_ps(isum));
              _mm512_store_ps(acc[r][j], _mm512_fmadd_ps(exact, group_scale, _mm512_load_ps(acc[r][j])));
            }
          }
        }
        for (int j = 0; j < pairs; ++j) {
          int64_t col;
          int valid = pair_columns(p.n, t, tiles, j, col);
          __m512 bias = load_bias(p.bias, col, valid);
          for (int r = 0; r < rows; ++r) {
            __m512 y = _mm512_fmadd_ps(_mm512_load_ps(acc[r][j]), _mm512_set1_ps(p.x_scale[i0 + r]), bias);
            store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);
          }
        }
      }
    }
    _tile_release();
  }
  if (full_rows < p.m) avx512vnni::w4a8_tiles(rows_from(p, full_rows), tile_begin, tile_end);
}

}  // namespace shrike::amx
