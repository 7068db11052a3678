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
void pairs_x_tile(const W8A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t) {
  const uint8_t* w = p.packed + t * w8a8_tile_bytes(p.k);
  int32x4_t mm[PAIRS][4];  // (pair, column pair)
  for (int j = 0; j < PAIRS; ++j)
    for (int c = 0; c < 4; ++c) mm[j][c] = vdupq_n_s32(0);
  for (int64_t k = 0; k < p.k; k += 8, w += 64) {
    // Two K steps of 4, each (rows 0-3 | rows 4-7) x 16 bytes; interleave them per column.
    uint32x4_t s0a = vreinterpretq_u32_u8(vld1q_u8(w)), s0b = vreinterpretq_u32_u8(vld1q_u8(w + 16));
    uint32x4_t s1a = vreinterpretq_u32_u8(vld1q_u8(w + 32)), s1b = vreinterpretq_u32_u8(vld1q_u8(w + 48));
    int8x16_t b01 = vreinterpretq_s8_u32(vzip1q_u32(s0a, s1a)), b23 = vreinterpretq_s8_u32(vzip2q_u32(s0a, s1a));
    int8x16_t b45 = vreinterpretq_s8_u32(vzip1q_u32(s0b, s1b)), b67 = vreinterpretq_s8_u32(vzip2q_u32(s0b, s1b));
    for (int j = 0; j < PAIRS; ++j) {
      int8x16_t a = vcombine_s8(vld1_s8(p.q + row_a[j] * p.k + k), vld1_s8(p.q + row_b[j] * p.k + k));
      mm[j][0] = vmmlaq_s32(mm[j][0], a, b01);
      mm[j][1] = vmmlaq_s32(mm[j][1], a, b23);
      mm[j][2] = vmmlaq_s32(mm[j][2], a, b45);
      mm[j][3] = vmmlaq_s32(mm[j][3], a, b67);
    }
  }
  const float* scale = reinterpret_cast<const float*>(w);
  int valid = neon::tile_valid(p.n, t);
  for (int h = 0; h < 2; ++h) {
    int hv = neon::half_valid(valid, h);
    float32x4_t bias = neon::load_bias(p.bias, t * kTileRows + 4 * h, hv);
    for (int j = 0; j < PAIRS; ++j) {
      int64x2_t c0 = vreinterpretq_s64_s32(mm[j][2 * h]), c1 = vreinterpretq_s64_s32(mm[j][2 * h + 1]);
      int32x4_t isum[2] = {vreinterpretq_s32_s64(vzip1q_s64(c0, c1)), vreinterpretq_s32_s64(vzip2q_s64(c0, c1))};
      for (int r = 0; r < (row_a[j] == row_b[j] ? 1 : 2); ++r) {
        int64_t i = r ? row_b[j] : row_a[j];
        float32x4_t combined = vmulq_n_f32(vld1q_f32(scale + 4 * h), p.x_scale[i]);
        float32x4_t y = vfmaq_f32(bias, vcvtq_f32_s32(isum[r]), combined);
        neon::store4(p.out, p.out_dtype, i * p.n + t * kTileRows + 4 * h, y, hv);
      }
    }
  }
}
}  // namespace

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto pairs, const int64_t* row_a, const int64_t* row_b, int64_t t) {
    pairs_x_tile<pairs>(p, row_a, row_b, t);
  };
  for_row_pairs_and_tiles(p.m, tile_begin, tile_end, kernel);
}

}  // namespace shrike::i8mm
