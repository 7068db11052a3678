// W8A8 with 512-bit vpdpbusd. One zmm holds two adjacent tiles (16 output columns) x 4 K.
// vpdpbusd multiplies unsigned by signed bytes: the weights are flipped to w + 128 (xor 0x80,
// one instruction per weight vector, shared by all rows of a block) and the activations stay
// signed; starting each accumulator at -128 * sum(q) makes it end at sum(q * w) exactly (int32
// wraps in between but the true result fits).
#include <immintrin.h>

#include "linear/epilogue_avx512.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avx512vnni {

namespace {
// MR rows x NB tiles over all of K; `tiles` < NB as in w4a8_avx512vnni.cpp.
// noinline: inlined into the driver's lambda, GCC keeps the accumulators in memory.
template <int MR, int NB>
__attribute__((noinline)) void rows_x_tiles(const W8A8Problem& p, int64_t i0, int64_t t, int64_t tiles) {
  constexpr int NP = NB / 2;
  const int64_t tile_bytes = w8a8_tile_bytes(p.k);
  const uint8_t* first[NP];
  const uint8_t* second[NP];
  _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
    first[j] = p.packed + (t + 2 * j) * tile_bytes;
    second[j] = p.packed + (t + (2 * j + 1 < tiles ? 2 * j + 1 : tiles - 1)) * tile_bytes;
  }
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * p.k;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i isum[MR][NP];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
    __m512i start = _mm512_set1_epi32(static_cast<int32_t>(-128 * p.x_sum[i0 + r]));
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) isum[r][j] = start;
  }
  int64_t offset = 0;
  for (int64_t k = 0; k < p.k; k += 4, offset += 32) {
    __m512i w[NP];
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) w[j] = _mm512_xor_si512(load_pair(first[j], second[j], offset), flip);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
      _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) dpbusd_broadcast(isum[r][j], w[j], q[r] + k);
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
    __m512 scale = _mm512_castsi512_ps(load_pair(first[j], second[j], offset));
    int64_t col = (t + 2 * j) * kTileRows;
    int64_t in_block = (tiles - 2 * j < 2 ? tiles - 2 * j : 2) * kTileRows;
    int valid = static_cast<int>(p.n - col < in_block ? p.n - col : in_block);
    __m512 bias = load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m512 combined = _mm512_mul_ps(_mm512_set1_ps(p.x_scale[i0 + r]), scale);
      __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][j]), combined, bias);
      store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);
    }
  }
}
}  // namespace

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    rows_x_tiles<rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, 8>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<8, 4>(p.m, tile_begin, tile_end, kernel);
}

}  // namespace shrike::avx512vnni
