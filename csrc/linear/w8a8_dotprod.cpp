#include <arm_neon.h>

#include "linear/epilogue_neon.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::dotprod {

namespace {
template <int MR>
void rows_x_tile(const W8A8Problem& p, int64_t i0, int64_t t) {
  const int8_t* w = reinterpret_cast<const int8_t*>(p.packed + t * w8a8_tile_bytes(p.k));
  // Independent accumulators per row (summed after the loop; integer sums are exact): one row
  // alone would wait on four dependent sdot per K block, so it spreads the K steps over 4 x 2.
  constexpr int A = MR == 1 ? 4 : MR == 2 ? 2 : 1;
  int32x4_t isum[MR][A][2];
  for (int r = 0; r < MR; ++r)
    for (int a = 0; a < A; ++a) isum[r][a][0] = isum[r][a][1] = vdupq_n_s32(0);
  for (int64_t k = 0; k < p.k; k += 16, w += 128) {
    // Four K steps of 4: (step, rows 0-3 | rows 4-7) x 16 bytes.
    int8x16_t s0a = vld1q_s8(w), s0b = vld1q_s8(w + 16), s1a = vld1q_s8(w + 32), s1b = vld1q_s8(w + 48);
    int8x16_t s2a = vld1q_s8(w + 64), s2b = vld1q_s8(w + 80), s3a = vld1q_s8(w + 96), s3b = vld1q_s8(w + 112);
    for (int r = 0; r < MR; ++r) {
      int8x16_t a = vld1q_s8(p.q + (i0 + r) * p.k + k);
      isum[r][0][0] = vdotq_laneq_s32(isum[r][0][0], s0a, a, 0);
      isum[r][0][1] = vdotq_laneq_s32(isum[r][0][1], s0b, a, 0);
      isum[r][1 % A][0] = vdotq_laneq_s32(isum[r][1 % A][0], s1a, a, 1);
      isum[r][1 % A][1] = vdotq_laneq_s32(isum[r][1 % A][1], s1b, a, 1);
      isum[r][2 % A][0] = vdotq_laneq_s32(isum[r][2 % A][0], s2a, a, 2);
      isum[r][2 % A][1] = vdotq_laneq_s32(isum[r][2 % A][1], s2b, a, 2);
      isum[r][3 % A][0] = vdotq_laneq_s32(isum[r][3 % A][0], s3a, a, 3);
      isum[r][3 % A][1] = vdotq_laneq_s32(isum[r][3 % A][1], s3b, a, 3);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int a = 1; a < A; ++a)
      for (int h = 0; h < 2; ++h) isum[r][0][h] = vaddq_s32(isum[r][0][h], isum[r][a][h]);
  const float* scale = reinterpret_cast<const float*>(w);
  int valid = neon::tile_valid(p.n, t);
  for (int h = 0; h < 2; ++h) {
    int hv = neon::half_valid(valid, h);
    float32x4_t bias = neon::load_bias(p.bias, t * kTileRows + 4 * h, hv);
    for (int r = 0; r < MR; ++r) {
      float32x4_t combined = vmulq_n_f32(vld1q_f32(scale + 4 * h), p.x_scale[i0 + r]);
      float32x4_t y = vfmaq_f32(bias, vcvtq_f32_s32(isum[r][0][h]), combined);
      neon::store4(p.out, p.out_dtype, (i0 + r) * p.n + t * kTileRows + 4 * h, y, hv);
    }
  }
}
}  // namespace

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  for_row_blocks_and_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t i0, int64_t t) {
    rows_x_tile<rows>(p, i0, t);
  });
}

}  // namespace shrike::dotprod
