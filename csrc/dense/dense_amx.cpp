// AMX-BF16: tdpbf16ps multiplies an activation tile (rows x 32 K) by a weight tile (16 K pairs x
// 16 outputs x 2) into an fp32 accumulator tile, with the arithmetic of common/amx_bf16_order.h,
// i.e. the tile order of dense_kernels.h. Outputs go in blocks of two panels (32), rows in blocks
// of two activation tiles; the four accumulator tiles stay in the tile unit across the whole of
// K, whose tiles are taken in order. Every row of an accumulator tile depends only on its own
// activation row, so the rows a tile holds (min(m, 16), zero-padded past m) change no result.
#include <immintrin.h>

#include <vector>

#include "common/amx_tile_config.h"
#include "dense/dense_kernels.h"
#include "dense/dense_tiles.h"

namespace shrike::amx {

namespace {

// tmm0-3 accumulators (rows x 16 fp32; row tile * 2 + panel), tmm4-5 activations (rows x 32 bf16),
// tmm6-7 weights (16 K pairs x 16 outputs x 2); configure_tiles(rows, 6) gives the first six `rows` rows.

constexpr int64_t kTileElements = kDenseTileK * kDensePanelCols;  // one weight tile: 512 bf16

// acc[row tile * 2 + panel] = sums over all K tiles of activation tiles a0 (a1) against weight
// panels b0 (b1); a_step: elements from one activation tile to the next.
template <bool kTwoRowTiles, bool kTwoPanels>
void multiply(const bf16* a0, const bf16* a1, int64_t a_step, const bf16* b0, const bf16* b1, int64_t k_tiles,
              float (*acc)[16][16]) {
  _tile_zero(0);
  if (kTwoPanels) _tile_zero(1);
  if (kTwoRowTiles) _tile_zero(2);
  if (kTwoRowTiles && kTwoPanels) _tile_zero(3);
  for (int64_t t = 0; t < k_tiles; ++t) {
    _tile_loadd(4, a0 + t * a_step, 64);
    _tile_loadd(6, b0 + t * kTileElements, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoPanels) {
      _tile_loadd(7, b1 + t * kTileElements, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (kTwoRowTiles) {
      _tile_loadd(5, a1 + t * a_step, 64);
      _tile_dpbf16ps(2, 5, 6);
      if (kTwoPanels) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, acc[0], 64);
  if (kTwoPanels) _tile_stored(1, acc[1], 64);
  if (kTwoRowTiles) _tile_stored(2, acc[2], 64);
  if (kTwoRowTiles && kTwoPanels) _tile_stored(3, acc[3], 64);
}

// y = sum + bias, as dense_store: fp32, or bf16 rounded to nearest even with NaN kept quiet.
void store_row(const DenseProblem& p, int64_t r, int64_t col, const float* sum, int valid) {
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  __m512 y = _mm512_loadu_ps(sum);
  if (p.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, p.bias + col));
  if (p.out_dtype == DType::f32) return _mm512_mask_storeu_ps(static_cast<float*>(p.out) + r * p.n + col, mask, y);
  const __m512i b = _mm512_castps_si512(y);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
  _mm256_mask_storeu_epi16(static_cast<bf16*>(p.out) + r * p.n + col, mask, _mm512_cvtepi32_epi16(rounded));
}

}  // namespace

void dense_tile_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t kp = dense_tiles_k(p.k), k_tiles = kp / kDenseTileK, panel_elements = kDensePanelCols * kp;
  const int rows = static_cast<int>(p.m < 16 ? p.m : 16);
  const int64_t a_step = rows * kDenseTileK, row_block_elements = k_tiles * a_step;
  thread_local std::vector<bf16> packed;  // a rows weight's two panels of the current block
  alignas(64) float acc[4][16][16];
  configure_tiles(rows, 6);
  for (int64_t c = c0; c < c1; c += 2 * kDensePanelCols) {
    const bool two_panels = c1 - c > kDensePanelCols;
    const bf16* b0 = static_cast<const bf16*>(p.w) + (c / kDensePanelCols) * panel_elements;
    if (p.w_layout == DenseLayout::rows) {
      packed.resize(2 * panel_elements);
      dense_pack_panels(static_cast<const bf16*>(p.w), p.n, p.k, c / kDensePanelCols, two_panels ? 2 : 1,
                        packed.data());
      b0 = packed.data();
    }
    const bf16* b1 = b0 + panel_elements;
    for (int64_t r = r0; r < r1; r += 2 * rows) {
      const bool two_row_tiles = r1 - r > rows;
      const bf16* a0 = p.x_tiles + (r / rows) * row_block_elements;
      const bf16* a1 = a0 + row_block_elements;
      if (two_row_tiles && two_panels) multiply<true, true>(a0, a1, a_step, b0, b1, k_tiles, acc);
      else if (two_row_tiles) multiply<true, false>(a0, a1, a_step, b0, b1, k_tiles, acc);
      else if (two_panels) multiply<false, true>(a0, a1, a_step, b0, b1, k_tiles, acc);
      else multiply<false, false>(a0, a1, a_step, b0, b1, k_tiles, acc);
      for (int tile = 0; tile < (two_row_tiles ? 2 : 1); ++tile)
        for (int panel = 0; panel < (two_panels ? 2 : 1); ++panel) {
          const int64_t col = c + panel * kDensePanelCols;
          const int valid = static_cast<int>(c1 - col < kDensePanelCols ? c1 - col : kDensePanelCols);
          for (int i = 0; i < rows && r + tile * rows + i < r1; ++i)
            store_row(p, r + tile * rows + i, col, acc[tile * 2 + panel][i], valid);
        }
    }
  }
  _tile_release();
}

}  // namespace shrike::amx
