#include <immintrin.h>

#include "linear/epilogue_avx2.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avx2 {

namespace {
// int8 x int8 through maddubs: |w| is the unsigned operand (|-128| = 128 fits) and q takes
// w's sign; |q| <= 127 keeps q's negation exact and a pair sum <= 2 * 128 * 127 < 32768.
template <int MR>
void rows_x_tile(const W8A8Problem& p, int64_t i0, int64_t t) {
  const uint8_t* w = p.packed + t * w8a8_tile_bytes(p.k);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum[MR];
  for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
  for (int64_t k = 0; k < p.k; k += 4, w += 32) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    __m256i magnitude = _mm256_abs_epi8(v);
    for (int r = 0; r < MR; ++r) {
      __m256i q = _mm256_sign_epi8(broadcast4(p.q + (i0 + r) * p.k + k), v);
      isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, q), ones));
    }
  }
  __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w));
  int valid = static_cast<int>(p.n - t * kTileRows < kTileRows ? p.n - t * kTileRows : kTileRows);
  __m256 bias = load_bias(p.bias, t * kTileRows, valid);
  for (int r = 0; r < MR; ++r) {
    __m256 combined = _mm256_mul_ps(_mm256_set1_ps(p.x_scale[i0 + r]), scale);
    __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), combined, bias);
    store_row(p.out, p.out_dtype, (i0 + r) * p.n + t * kTileRows, y, valid);
  }
}
}  // namespace

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  for_row_blocks_and_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t i0, int64_t t) {
    rows_x_tile<rows>(p, i0, t);
  });
}

}  // namespace shrike::avx2
