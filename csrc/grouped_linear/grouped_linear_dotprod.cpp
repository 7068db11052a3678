// Grouped linear with NEON sdot (Armv8.2 dotprod; also what i8mm and SVE2 machines run).
// sdot multiplies signed bytes, so int8 values go in as stored and 4-bit values (0..15, or w + 8
// without mins, whose 8 the group sums remove) after a mask or a shift, 6-bit ones (0..63, or w + 32)
// with their top two bits or-ed in from the high-bit plane, codebook indices after a table lookup (tbl);
// a slice's 32 bytes are rows 0-3 then rows 4-7, four K values per 32-bit lane, exactly one sdot operand
// per half tile. Group sums are exact int32, so the float epilogue is
// grouped_ref.cpp's in the same order.
#include <arm_neon.h>

#include "grouped_linear/grouped_layout.h"
#include "linear/epilogue_neon.h"
#include "linear/gemm_driver.h"

namespace shrike::dotprod {

namespace {

inline float32x4_t load_f16x4(const uint8_t* p, int h) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p) + 4 * h)));
}

// Half h (rows 4h..4h+3) of a tile's 8 scales (or mins) in the weight's form; header: a factored
// weight's superblock d (or dmin).
inline float32x4_t load_params(const uint8_t* p, const uint8_t* header, int h, GroupedParams form) {
  if (form == GroupedParams::kFloat16) return load_f16x4(p, h);
  if (form == GroupedParams::kFactored) {  // d * factor, exact in float32
    const int16x8_t factors = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p)));
    const int32x4_t half = vmovl_s16(h == 0 ? vget_low_s16(factors) : vget_high_s16(factors));
    return vmulq_f32(load_f16x4(header, h), vcvtq_f32_s32(half));
  }
  return vld1q_f32(reinterpret_cast<const float*>(p) + 4 * h);
}

template <int BITS, bool MIN, bool CB, int MR>
void rows_x_tile(const GroupedProblem& p, int64_t i0, int64_t t) {
  const GroupedWeight& wt = p.w;
  const int64_t groups = wt.k / wt.group, blocks = wt.k / kGroupedActivationBlock, param_bytes = grouped_param_bytes(wt);
  const uint8_t* w = wt.packed + t * grouped_tile_bytes(wt);
  const uint8_t* header = w;  // the superblock's d (factored)
  const uint8x16_t low4 = vdupq_n_u8(0x0f);
  const int8x16_t levels = vld1q_s8(kGroupedCodebook);
  float32x4_t acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; ++g) {
    if (grouped_opens_superblock(wt, g)) header = w, w += grouped_header_bytes(wt);
    const int64_t k0 = g * wt.group;
    int32x4_t isum[MR][2];
    for (int r = 0; r < MR; ++r)  // 4- and 6-bit values without mins are stored w + 8, w + 32
      isum[r][0] = isum[r][1] = vdupq_n_s32(MIN || BITS == 8 || CB ? 0 : (BITS == 4 ? -8 : -32) * p.group_sum[(i0 + r) * groups + g]);
    const uint8_t* top = w + grouped_value_bytes(wt.group, 4);  // 6-bit: the high-bit plane
    for (int64_t kb = k0; kb < k0 + wt.group; kb += 16) {
      // 16 K values: four 8-bit slices, or two 4-bit slices whose low and high nibbles take turns.
      int8x16_t s[4][2];
      if constexpr (BITS == 8) {
        for (int i = 0; i < 4; ++i, w += 32) s[i][0] = vld1q_s8(reinterpret_cast<const int8_t*>(w)), s[i][1] = vld1q_s8(reinterpret_cast<const int8_t*>(w + 16));
      } else {
        for (int i = 0; i < 2; ++i, w += 32)
          for (int h = 0; h < 2; ++h) {
            uint8x16_t v = vld1q_u8(w + 16 * h);
            s[2 * i][h] = vreinterpretq_s8_u8(vandq_u8(v, low4));
            s[2 * i + 1][h] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            if constexpr (CB)
              for (int n = 0; n < 2; ++n) s[2 * i + n][h] = vqtbl1q_s8(levels, vreinterpretq_u8_s8(s[2 * i + n][h]));
          }
        if constexpr (BITS == 6) {  // steps 0-3 take bits 0-1, 2-3, 4-5, 6-7 of the plane's bytes at bit 4
          const uint8x16_t top_mask = vdupq_n_u8(0x30);
          for (int h = 0; h < 2; ++h, top += 16) {
            const uint8x16_t t = vld1q_u8(top);
            const uint8x16_t at4[4] = {vandq_u8(vshlq_n_u8(t, 4), top_mask), vandq_u8(vshlq_n_u8(t, 2), top_mask),
                                       vandq_u8(t, top_mask), vandq_u8(vshrq_n_u8(t, 2), top_mask)};
            for (int i = 0; i < 4; ++i) s[i][h] = vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(s[i][h]), at4[i]));
          }
        }
      }
      for (int r = 0; r < MR; ++r) {
        int8x16_t a = vld1q_s8(p.q + (i0 + r) * wt.k + kb);
        for (int h = 0; h < 2; ++h) {
          isum[r][h] = vdotq_laneq_s32(isum[r][h], s[0][h], a, 0);
          isum[r][h] = vdotq_laneq_s32(isum[r][h], s[1][h], a, 1);
          isum[r][h] = vdotq_laneq_s32(isum[r][h], s[2][h], a, 2);
          isum[r][h] = vdotq_laneq_s32(isum[r][h], s[3][h], a, 3);
        }
      }
    }
    if constexpr (BITS == 6) w = top;
    const int64_t b = k0 / kGroupedActivationBlock;
    float32x4_t scale[2], min[2];
    for (int h = 0; h < 2; ++h) {
      scale[h] = load_params(w, header, h, wt.params);
      if constexpr (MIN) min[h] = load_params(w + param_bytes, header + 2 * kTileRows, h, wt.params);
    }
    for (int r = 0; r < MR; ++r) {
      const int64_t i = i0 + r;
      for (int h = 0; h < 2; ++h) {
        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(isum[r][h]), vmulq_n_f32(scale[h], p.x_scale[i * blocks + b]));
        if constexpr (MIN) acc[r][h] = vfmaq_f32(acc[r][h], vdupq_n_f32(p.x_min[i * groups + g]), min[h]);
      }
    }
    w += MIN ? 2 * param_bytes : param_bytes;
  }
  const int valid = neon::tile_valid(wt.n, t);
  for (int h = 0; h < 2; ++h) {
    const int hv = neon::half_valid(valid, h);
    const float32x4_t bias = neon::load_bias(p.bias, t * kTileRows + 4 * h, hv);
    for (int r = 0; r < MR; ++r)
      neon::store4(p.out, p.out_dtype, (i0 + r) * p.out_stride + t * kTileRows + 4 * h, vaddq_f32(acc[r][h], bias), hv);
  }
}

template <int BITS, bool MIN, bool CB = false>
void walk(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  for_row_blocks_and_tiles(p.m, tile_begin, tile_end,
                           [&](auto rows, int64_t i0, int64_t t) { rows_x_tile<BITS, MIN, CB, rows>(p, i0, t); });
}

}  // namespace

void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  if (p.w.bits == 8) {
    if (p.w.has_min) return walk<8, true>(p, tile_begin, tile_end);
    return walk<8, false>(p, tile_begin, tile_end);
  }
  if (p.w.bits == 6) {
    if (p.w.has_min) return walk<6, true>(p, tile_begin, tile_end);
    return walk<6, false>(p, tile_begin, tile_end);
  }
  if (p.w.codebook) return walk<4, false, true>(p, tile_begin, tile_end);
  if (p.w.has_min) return walk<4, true>(p, tile_begin, tile_end);
  walk<4, false>(p, tile_begin, tile_end);
}

}  // namespace shrike::dotprod
