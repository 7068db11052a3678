// aarch64 NEON: a K block's 16 accumulator lanes live in four registers, lane j in register j / 4
// (register q holds the pairs of K 8q .. 8q + 7). Weights are widened from bytes to 32-bit lanes
// (lane j = the pair 2j, 2j + 1), split into even and odd elements and dequantized with one fma each.
#include <arm_neon.h>

#include "weight_only/weight_only_kernels.h"

namespace shrike::dotprod {

namespace {

struct Pairs {
  float32x4_t odd, even;
};

inline Pairs load_x(const bf16* p, int q) {
  uint32x4_t v = vreinterpretq_u32_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p) + 8 * q));
  return {vreinterpretq_f32_u32(vandq_u32(v, vdupq_n_u32(0xffff0000u))), vreinterpretq_f32_u32(vshlq_n_u32(v, 16))};
}

inline Pairs load_x(const float* p, int q) {
  float32x4x2_t v = vld2q_f32(p + 8 * q);  // val[0] = even elements, val[1] = odd
  return {v.val[1], v.val[0]};
}

// The pairs of register q as 32-bit lanes (low half: the even element, high bits: the odd one).
template <int BITS>
inline uint32x4_t pair_lanes(const WeightOnlyWeight& w, int64_t c, int64_t b, int q) {
  if constexpr (BITS == 4) {
    uint8x8_t bytes = vreinterpret_u8_u32(vld1_dup_u32(reinterpret_cast<const uint32_t*>(w.q + (c * w.k + b) / 2 + 4 * q)));
    return vmovl_u16(vget_low_u16(vmovl_u8(bytes)));
  } else {
    return vreinterpretq_u32_u16(vmovl_u8(vld1_u8(w.q + c * w.k + b + 8 * q)));
  }
}

template <int BITS>
inline Pairs load_w(const WeightOnlyWeight& w, int64_t c, int64_t b, int q, float32x4_t s, float32x4_t o) {
  uint32x4_t v = pair_lanes<BITS>(w, c, b, q);
  uint32x4_t even = vandq_u32(v, vdupq_n_u32(BITS == 4 ? 15u : 0xffffu));
  uint32x4_t odd = vshrq_n_u32(v, BITS == 4 ? 4 : 16);
  return {vfmaq_f32(o, vcvtq_f32_u32(odd), s), vfmaq_f32(o, vcvtq_f32_u32(even), s)};
}

// Lane j += lane j + 8, + 4, + 2, + 1.
inline float reduce16(const float32x4_t acc[4]) {
  float32x4_t a = vaddq_f32(acc[0], acc[2]), b = vaddq_f32(acc[1], acc[3]);
  float32x4_t s = vaddq_f32(a, b);
  float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
  return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

template <int RB, int CB, typename XT, int BITS>
void block(const WeightOnlyProblem& p, int64_t r0, int64_t c0) {
  const int64_t k = p.w.k;
  const XT* x = static_cast<const XT*>(p.x) + r0 * k;
  float32x4_t acc[RB][CB][4];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c)
      SHRIKE_UNROLL for (int q = 0; q < 4; ++q) acc[r][c][q] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < k; b += 32) {
    float32x4_t s[CB], o[CB];
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
      int64_t g = weight_only_group(p.w, c0 + c, b);
      s[c] = vdupq_n_f32(p.w.scale[g]);
      o[c] = vdupq_n_f32(p.w.offset[g]);
    }
    SHRIKE_UNROLL for (int q = 0; q < 4; ++q) {
      Pairs xp[RB];
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_x(x + r * k + b, q);
      SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
        Pairs wp = load_w<BITS>(p.w, c0 + c, b, q, s[c], o[c]);
        SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
          acc[r][c][q] = vfmaq_f32(acc[r][c][q], xp[r].odd, wp.odd);
          acc[r][c][q] = vfmaq_f32(acc[r][c][q], xp[r].even, wp.even);
        }
      }
    }
  }
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) weight_only_store(p, r0 + r, c0 + c, reduce16(acc[r][c]));
}

// One row (decode): 4 outputs at a time; more rows: 2 x 2 blocks, then the remainders.
template <typename XT, int BITS>
void typed(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (r1 - r0 == 1) {
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4) block<1, 4, XT, BITS>(p, r0, c);
    for (; c < c1; ++c) block<1, 1, XT, BITS>(p, r0, c);
    return;
  }
  int64_t c = c0;
  for (; c + 2 <= c1; c += 2) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) block<2, 2, XT, BITS>(p, r, c);
    if (r < r1) block<1, 2, XT, BITS>(p, r, c);
  }
  if (c < c1) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) block<2, 1, XT, BITS>(p, r, c);
    if (r < r1) block<1, 1, XT, BITS>(p, r, c);
  }
}

}  // namespace

void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const bool xf = p.x_dtype == DType::f32;
  if (p.w.bits == 4)
    return xf ? typed<float, 4>(p, r0, r1, c0, c1) : typed<bf16, 4>(p, r0, r1, c0, c1);
  return xf ? typed<float, 8>(p, r0, r1, c0, c1) : typed<bf16, 8>(p, r0, r1, c0, c1);
}

}  // namespace shrike::dotprod
