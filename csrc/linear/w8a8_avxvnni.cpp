// W8A8 with 256-bit VEX vpdpbusd (AVX-VNNI). One ymm holds one tile (8 output columns) x 4 K.
// As in w8a8_avx512vnni.cpp, the weights are flipped to w + 128 (xor 0x80) to be the unsigned
// operand and each accumulator starts at -128 * sum(q), ending at sum(q * w) exactly.
#include <immintrin.h>

#include "linear/epilogue_avx2.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avxvnni {

namespace {
using avx2::load_bias;
using avx2::store_row;

// acc += u . broadcast(q), in place (see w4a8_avxvnni.cpp for why this is asm).
inline void dpbusd_broadcast(__m256i& acc, __m256i u, const int8_t* q) {
  __m256i b;
  __asm__("vpbroadcastd %2, %1\n\t%{vex%} vpdpbusd %1, %3, %0"
          : "+x"(acc), "=&x"(b)
          : "m"(*reinterpret_cast<const int32_t*>(q)), "x"(u));
}

// MR rows x NB tiles over all of K; `tiles` < NB as in w4a8_avxvnni.cpp.
// noinline: inlined into the driver's lambda, GCC keeps the accumulators in memory.
template <int MR, int NB>
__attribute__((noinline)) void rows_x_tiles(const W8A8Problem& p, int64_t i0, int64_t t, int64_t tiles) {
  const int64_t tile_bytes = w8a8_tile_bytes(p.k);
  const uint8_t* w[NB];
  _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) w[j] = p.packed + (t + (j < tiles ? j : tiles - 1)) * tile_bytes;
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * p.k;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i isum[MR][NB];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
    __m256i start = _mm256_set1_epi32(static_cast<int32_t>(-128 * p.x_sum[i0 + r]));
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) isum[r][j] = start;
  }
  int64_t offset = 0;
  for (int64_t k = 0; k < p.k; k += 4, offset += 32) {
    __m256i v[NB];
    _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j)
      v[j] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j] + offset)), flip);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
      _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) dpbusd_broadcast(isum[r][j], v[j], q[r] + k);
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NB; ++j) {
    if (j == tiles) break;  // not in the loop condition: a runtime bound stops the unrolling
    __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w[j] + offset));
    int64_t col = (t + j) * kTileRows;
    int valid = static_cast<int>(p.n - col < kTileRows ? p.n - col : kTileRows);
    __m256 bias = load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m256 combined = _mm256_mul_ps(_mm256_set1_ps(p.x_scale[i0 + r]), scale);
      __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][j]), combined, bias);
      store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);
    }
  }
}
}  // namespace

// VEX code has 16 ymm registers: 4 rows x 2 tiles keeps 8 accumulators, 2 weight vectors and
// the row broadcasts in registers; decode rows take 4 tiles to hide the vpdpbusd latency.
void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    rows_x_tiles<rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, 4>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<4, 2>(p.m, tile_begin, tile_end, kernel);
}

}  // namespace shrike::avxvnni
