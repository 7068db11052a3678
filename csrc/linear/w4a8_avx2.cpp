#include <immintrin.h>

#include "common/prefetch_x86.h"
#include "linear/epilogue_avx2.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avx2 {

namespace {
// MR rows x one tile of 8 columns over all of K.
// The weights are the unsigned maddubs operand (w + 8 in [0, 15]) and q the signed one, so a
// pair sum is at most 2 * 15 * 128 = 3840 and eight of them (32 K) still fit int16 exactly.
template <int MR>
void rows_x_tile(const W4A8Problem& p, int64_t i0, int64_t t) {
  const int64_t groups = p.k / p.group;
  const uint8_t* w = p.packed + t * w4a8_tile_bytes(p.k, p.group);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  // Float accumulators live in memory: touched once per group, they would otherwise take
  // registers the inner loop needs (MR = 4 spills inside the K loop without this).
  alignas(32) float acc[MR][8] = {};
  for (int64_t g = 0; g < groups; ++g) {
    __m256i isum[MR];
    for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 32) {
      __m256i pair_sums[MR];
      for (int r = 0; r < MR; ++r) pair_sums[r] = _mm256_setzero_si256();
      for (int s = 0; s < 4; ++s, w += 32) {
        if ((s & 1) == 0) prefetch_stream(w);
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        __m256i lo = _mm256_and_si256(v, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int r = 0; r < MR; ++r) {
          const int8_t* q = p.q + (i0 + r) * p.k + kb + 8 * s;
          pair_sums[r] = _mm256_add_epi16(pair_sums[r], _mm256_maddubs_epi16(lo, broadcast4(q)));
          pin_in_register(pair_sums[r]);
          pair_sums[r] = _mm256_add_epi16(pair_sums[r], _mm256_maddubs_epi16(hi, broadcast4(q + 4)));
          pin_in_register(pair_sums[r]);
        }
      }
      for (int r = 0; r < MR; ++r) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pair_sums[r], ones));
    }
    __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w));
    __m256i wsum = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 32)));
    w += 48;
    for (int r = 0; r < MR; ++r) {
      int64_t i = i0 + r;
      // isum holds sum((w + 8) * q); the exact sum((q - zero) * w) is that minus 8 * sum(q) - zero * sum(w).
      __m256i correction = _mm256_add_epi32(_mm256_set1_epi32(8 * p.x_group_sum[i * groups + g]),
                                            _mm256_mullo_epi32(_mm256_set1_epi32(p.x_zero[i]), wsum));
      __m256 sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], correction)), scale, _mm256_load_ps(acc[r]));
      _mm256_store_ps(acc[r], sum);
    }
  }
  int valid = static_cast<int>(p.n - t * kTileRows < kTileRows ? p.n - t * kTileRows : kTileRows);
  __m256 bias = load_bias(p.bias, t * kTileRows, valid);
  for (int r = 0; r < MR; ++r) {
    __m256 y = _mm256_fmadd_ps(_mm256_load_ps(acc[r]), _mm256_set1_ps(p.x_scale[i0 + r]), bias);
    store_row(p.out, p.out_dtype, (i0 + r) * p.n + t * kTileRows, y, valid);
  }
}
}  // namespace

void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  for_row_blocks_and_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t i0, int64_t t) {
    rows_x_tile<rows>(p, i0, t);
  });
}

}  // namespace shrike::avx2
