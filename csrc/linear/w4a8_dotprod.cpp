#include <arm_neon.h>

#include "linear/epilogue_neon.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::dotprod {

namespace {
// MR rows x one tile of 8 columns (two halves of 4) over all of K. sdot multiplies the
// stored w + 8 (0..15, a valid int8) by q directly; the +8 is removed per group.
template <int MR>
void rows_x_tile(const W4A8Problem& p, int64_t i0, int64_t t) {
  const int64_t groups = p.k / p.group;
  const uint8_t* w = p.packed + t * w4a8_tile_bytes(p.k, p.group);
  const uint8x16_t low4 = vdupq_n_u8(0x0f);
  float32x4_t acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; ++g) {
    int32x4_t isum[MR][2];
    for (int r = 0; r < MR; ++r) isum[r][0] = isum[r][1] = vdupq_n_s32(0);
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 16, w += 64) {
      // Two K steps of 8: (step, rows 0-3 | rows 4-7) x 16 bytes.
      uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16), v2 = vld1q_u8(w + 32), v3 = vld1q_u8(w + 48);
      int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, low4)), hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
      int8x16_t lo1 = vreinterpretq_s8_u8(vandq_u8(v1, low4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
      int8x16_t lo2 = vreinterpretq_s8_u8(vandq_u8(v2, low4)), hi2 = vreinterpretq_s8_u8(vshrq_n_u8(v2, 4));
      int8x16_t lo3 = vreinterpretq_s8_u8(vandq_u8(v3, low4)), hi3 = vreinterpretq_s8_u8(vshrq_n_u8(v3, 4));
      for (int r = 0; r < MR; ++r) {
        // 32-bit lanes of a: k 0-3 (low nibbles of step 0), 4-7 (high), 8-11, 12-15 (step 1).
        int8x16_t a = vld1q_s8(p.q + (i0 + r) * p.k + kb);
        isum[r][0] = vdotq_laneq_s32(isum[r][0], lo0, a, 0);
        isum[r][1] = vdotq_laneq_s32(isum[r][1], lo1, a, 0);
        isum[r][0] = vdotq_laneq_s32(isum[r][0], hi0, a, 1);
        isum[r][1] = vdotq_laneq_s32(isum[r][1], hi1, a, 1);
        isum[r][0] = vdotq_laneq_s32(isum[r][0], lo2, a, 2);
        isum[r][1] = vdotq_laneq_s32(isum[r][1], lo3, a, 2);
        isum[r][0] = vdotq_laneq_s32(isum[r][0], hi2, a, 3);
        isum[r][1] = vdotq_laneq_s32(isum[r][1], hi3, a, 3);
      }
    }
    const float* scale = reinterpret_cast<const float*>(w);
    int16x8_t wsum = vld1q_s16(reinterpret_cast<const int16_t*>(w + 32));
    int32x4_t wsum_half[2] = {vmovl_s16(vget_low_s16(wsum)), vmovl_high_s16(wsum)};
    w += 48;
    for (int r = 0; r < MR; ++r) {
      int64_t i = i0 + r;
      int32x4_t eight_sum = vdupq_n_s32(8 * p.x_group_sum[i * groups + g]);
      for (int h = 0; h < 2; ++h) {
        // isum holds sum((w + 8) * q); the exact sum((q - zero) * w) is that minus 8 * sum(q) - zero * sum(w).
        int32x4_t correction = vmlaq_n_s32(eight_sum, wsum_half[h], p.x_zero[i]);
        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(vsubq_s32(isum[r][h], correction)), vld1q_f32(scale + 4 * h));
      }
    }
  }
  int valid = neon::tile_valid(p.n, t);
  for (int h = 0; h < 2; ++h) {
    int hv = neon::half_valid(valid, h);
    float32x4_t bias = neon::load_bias(p.bias, t * kTileRows + 4 * h, hv);
    for (int r = 0; r < MR; ++r) {
      float32x4_t y = vfmaq_n_f32(bias, acc[r][h], p.x_scale[i0 + r]);
      neon::store4(p.out, p.out_dtype, (i0 + r) * p.n + t * kTileRows + 4 * h, y, hv);
    }
  }
}
}  // namespace

void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  for_row_blocks_and_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t i0, int64_t t) {
    rows_x_tile<rows>(p, i0, t);
  });
}

}  // namespace shrike::dotprod
