#include <arm_neon.h>

#include "linear/epilogue_neon.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::i8mm {

namespace {
// smmla: (2 rows x 8 K) . (2 columns x 8 K)^T -> [r0c0, r0c1, r1c0, r1c1].
// Rows (row_a[j], row_b[j]) for pair j; an odd last row is paired with itself and stored once.
template <int PAIRS>
void pairs_x_tile(const W4A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t) {
  const int64_t groups = p.k / p.group;
  const uint8_t* w = p.packed + t * w4a8_tile_bytes(p.k, p.group);
  const uint8x16_t low4 = vdupq_n_u8(0x0f);
  float32x4_t acc[PAIRS][2][2];  // (pair, row of pair, column half)
  for (int j = 0; j < PAIRS; ++j)
    for (int r = 0; r < 2; ++r) acc[j][r][0] = acc[j][r][1] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; ++g) {
    int32x4_t mm[PAIRS][4];  // (pair, column pair)
    for (int j = 0; j < PAIRS; ++j)
      for (int c = 0; c < 4; ++c) mm[j][c] = vdupq_n_s32(0);
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 8, w += 32) {
      uint8x16_t v0 = vld1q_u8(w), v1 = vld1q_u8(w + 16);
      uint32x4_t lo0 = vreinterpretq_u32_u8(vandq_u8(v0, low4)), hi0 = vreinterpretq_u32_u8(vshrq_n_u8(v0, 4));
      uint32x4_t lo1 = vreinterpretq_u32_u8(vandq_u8(v1, low4)), hi1 = vreinterpretq_u32_u8(vshrq_n_u8(v1, 4));
      // Interleave K 0-3 (low nibbles) and 4-7 (high) per column: (2 columns, 8 K) operands.
      int8x16_t b01 = vreinterpretq_s8_u32(vzip1q_u32(lo0, hi0)), b23 = vreinterpretq_s8_u32(vzip2q_u32(lo0, hi0));
      int8x16_t b45 = vreinterpretq_s8_u32(vzip1q_u32(lo1, hi1)), b67 = vreinterpretq_s8_u32(vzip2q_u32(lo1, hi1));
      for (int j = 0; j < PAIRS; ++j) {
        int8x16_t a = vcombine_s8(vld1_s8(p.q + row_a[j] * p.k + kb), vld1_s8(p.q + row_b[j] * p.k + kb));
        mm[j][0] = vmmlaq_s32(mm[j][0], a, b01);
        mm[j][1] = vmmlaq_s32(mm[j][1], a, b23);
        mm[j][2] = vmmlaq_s32(mm[j][2], a, b45);
        mm[j][3] = vmmlaq_s32(mm[j][3], a, b67);
      }
    }
    const float* scale = reinterpret_cast<const float*>(w);
    int16x8_t wsum = vld1q_s16(reinterpret_cast<const int16_t*>(w + 32));
    int32x4_t wsum_half[2] = {vmovl_s16(vget_low_s16(wsum)), vmovl_high_s16(wsum)};
    w += 48;
    for (int j = 0; j < PAIRS; ++j)
      for (int h = 0; h < 2; ++h) {
        int64x2_t c0 = vreinterpretq_s64_s32(mm[j][2 * h]), c1 = vreinterpretq_s64_s32(mm[j][2 * h + 1]);
        int32x4_t isum[2] = {vreinterpretq_s32_s64(vzip1q_s64(c0, c1)), vreinterpretq_s32_s64(vzip2q_s64(c0, c1))};
        for (int r = 0; r < 2; ++r) {
          int64_t i = r ? row_b[j] : row_a[j];
          // isum holds sum((w + 8) * q); the exact sum((q - zero) * w) is that minus 8 * sum(q) - zero * sum(w).
          int32x4_t correction = vmlaq_n_s32(vdupq_n_s32(8 * p.x_group_sum[i * groups + g]), wsum_half[h], p.x_zero[i]);
          acc[j][r][h] = vfmaq_f32(acc[j][r][h], vcvtq_f32_s32(vsubq_s32(isum[r], correction)), vld1q_f32(scale + 4 * h));
        }
      }
  }
  int valid = neon::tile_valid(p.n, t);
  for (int h = 0; h < 2; ++h) {
    int hv = neon::half_valid(valid, h);
    float32x4_t bias = neon::load_bias(p.bias, t * kTileRows + 4 * h, hv);
    for (int j = 0; j < PAIRS; ++j)
      for (int r = 0; r < (row_a[j] == row_b[j] ? 1 : 2); ++r) {
        int64_t i = r ? row_b[j] : row_a[j];
        float32x4_t y = vfmaq_n_f32(bias, acc[j][r][h], p.x_scale[i]);
        neon::store4(p.out, p.out_dtype, i * p.n + t * kTileRows + 4 * h, y, hv);
      }
  }
}
}  // namespace

void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto pairs, const int64_t* row_a, const int64_t* row_b, int64_t t) {
    pairs_x_tile<pairs>(p, row_a, row_b, t);
  };
  for_row_pairs_and_tiles(p.m, tile_begin, tile_end, kernel);
}

}  // namespace shrike::i8mm
