// W4A8 with 512-bit vpdpbusd. One zmm holds two adjacent tiles (16 output columns) x 4 K; the
// stored nibbles w + 8 are the unsigned operand and the activations the signed one, so every
// product is exact and nothing saturates.
#include <immintrin.h>

#include "linear/epilogue_avx512.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avx512vnni {

namespace {
// MR rows x NB tiles (NB / 2 zmm column pairs) over all of K. `tiles` < NB only for the last
// block of a range; its missing tile re-reads the last one and is not stored.
// noinline: inlined into the driver's lambda, GCC keeps the accumulators in memory.
template <int MR, int NB>
__attribute__((noinline)) void rows_x_tiles(const W4A8Problem& p, int64_t i0, int64_t t, int64_t tiles) {
  constexpr int NP = NB / 2;
  const int64_t groups = p.k / p.group, tile_bytes = w4a8_tile_bytes(p.k, p.group);
  const uint8_t* first[NP];
  const uint8_t* second[NP];
  _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
    first[j] = p.packed + (t + 2 * j) * tile_bytes;
    second[j] = p.packed + (t + (2 * j + 1 < tiles ? 2 * j + 1 : tiles - 1)) * tile_bytes;
  }
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * p.k;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  alignas(64) float acc[MR][NP][16] = {};
  int64_t offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    // Starting at -8 * sum(q) removes the +8 of the stored weights: the group then ends
    // holding sum(q * w) exactly.
    __m512i isum[MR][NP];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m512i start = _mm512_set1_epi32(-8 * p.x_group_sum[(i0 + r) * groups + g]);
      _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) isum[r][j] = start;
    }
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 8, offset += 32) {
      __m512i lo[NP], hi[NP];
      _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
        __m512i v = load_pair(first[j], second[j], offset);
        lo[j] = _mm512_and_si512(v, low4);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
          dpbusd_broadcast(isum[r][j], lo[j], q[r] + kb);
          dpbusd_broadcast(isum[r][j], hi[j], q[r] + kb + 4);
        }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
      __m512 scale = _mm512_castsi512_ps(load_pair(first[j], second[j], offset));
      __m512 wsum = _mm512_cvtepi32_ps(load_pair_i16(first[j], second[j], offset + 32));
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        // sum((q - zero) * w) = sum(q * w) - zero * sum(w), done in float: for groups up to 128
        // every term and the result are integers below 2^24, so the fused step is exact and
        // equals float(isum) of the reference.
        __m512 exact = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(p.x_zero[i0 + r])), wsum,
                                        _mm512_cvtepi32_ps(isum[r][j]));
        _mm512_store_ps(acc[r][j], _mm512_fmadd_ps(exact, scale, _mm512_load_ps(acc[r][j])));
      }
    }
    offset += 48;
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
    int64_t col = (t + 2 * j) * kTileRows;
    int64_t in_block = (tiles - 2 * j < 2 ? tiles - 2 * j : 2) * kTileRows;
    int valid = static_cast<int>(p.n - col < in_block ? p.n - col : in_block);
    __m512 bias = load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m512 y = _mm512_fmadd_ps(_mm512_load_ps(acc[r][j]), _mm512_set1_ps(p.x_scale[i0 + r]), bias);
      store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);
    }
  }
}
}  // namespace

// Decode rows take 8 tiles per block so that enough independent accumulators hide the
// vpdpbusd latency; prefill takes 8 rows x 4 tiles (16 accumulators, weights reused 8 times).
void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    rows_x_tiles<rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, 8>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<8, 4>(p.m, tile_begin, tile_end, kernel);
}

}  // namespace shrike::avx512vnni
