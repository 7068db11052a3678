// W4A8 with 256-bit VEX vpdpbusd (AVX-VNNI): the AVX2 kernel's maddubs + add + madd chain
// becomes one instruction per 4 K. One ymm holds one tile (8 output columns) x 4 K; the stored
// nibbles w + 8 are the unsigned operand, so every product is exact and nothing saturates.
#include <immintrin.h>

#include "linear/epilogue_avx2.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avxvnni {

namespace {
using avx2::load_bias;
using avx2::store_row;

// acc += dot products of the unsigned bytes u with the four int8 at q repeated in every lane.
// Written as asm so acc is updated in place and each broadcast is used once: from intrinsics
// GCC copies accumulators and hoists the broadcasts, which spills 16 ymm registers.
inline void dpbusd_broadcast(__m256i& acc, __m256i u, const int8_t* q) {
  __m256i b;
  __asm__("vpbroadcastd %2, %1\n\t%{vex%} vpdpbusd %1, %3, %0"
          : "+x"(acc), "=&x"(b)
          : "m"(*reinterpret_cast<const int32_t*>(q)), "x"(u));
}

// MR rows x NB tiles over all of K. `tiles` < NB only for the last block of a range; its
// missing tile re-reads the last one and is not stored.
// noinline: inlined into the driver's lambda, GCC keeps the accumulators in memory.
template <int MR, int NB>
__attribute__((noinline)) void rows_x_tiles(const W4A8Problem& p, int64_t i0, int64_t t, int64_t tiles) {
  const int64_t groups = p.k / p.group, tile_bytes = w4a8_tile_bytes(p.k, p.group);
  const uint8_t* w[NB];
  _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) w[j] = p.packed + (t + (j < tiles ? j : tiles - 1)) * tile_bytes;
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * p.k;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  alignas(32) float acc[MR][NB][8] = {};
  int64_t offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    // Starting at -8 * sum(q) removes the +8 of the stored weights (see w4a8_avx512vnni.cpp).
    __m256i isum[MR][NB];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m256i start = _mm256_set1_epi32(-8 * p.x_group_sum[(i0 + r) * groups + g]);
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) isum[r][j] = start;
    }
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 8, offset += 32) {
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) {
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j] + offset));
        __m256i lo = _mm256_and_si256(v, low4);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) dpbusd_broadcast(isum[r][j], lo, q[r] + kb);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) dpbusd_broadcast(isum[r][j], hi, q[r] + kb + 4);
      }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) {
      __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w[j] + offset));
      __m256 wsum = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[j] + offset + 32))));
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        // Exact in float for groups up to 128 (see w4a8_avx512vnni.cpp).
        __m256 exact = _mm256_fnmadd_ps(_mm256_set1_ps(static_cast<float>(p.x_zero[i0 + r])), wsum,
                                        _mm256_cvtepi32_ps(isum[r][j]));
        _mm256_store_ps(acc[r][j], _mm256_fmadd_ps(exact, scale, _mm256_load_ps(acc[r][j])));
      }
    }
    offset += 48;
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) {
    if (j == tiles) break;  // not in the loop condition: a runtime bound stops the unrolling
    int64_t col = (t + j) * kTileRows;
    int valid = static_cast<int>(p.n - col < kTileRows ? p.n - col : kTileRows);
    __m256 bias = load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m256 y = _mm256_fmadd_ps(_mm256_load_ps(acc[r][j]), _mm256_set1_ps(p.x_scale[i0 + r]), bias);
      store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);
    }
  }
}
}  // namespace

// VEX code has 16 ymm registers: 4 rows x 2 tiles keeps 8 accumulators, 4 weight vectors and
// the row broadcasts in registers; decode rows take 4 tiles to hide the vpdpbusd latency.
void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    rows_x_tiles<rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, 4>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<4, 2>(p.m, tile_begin, tile_end, kernel);
}

}  // namespace shrike::avxvnni
