// aarch64 NEON: a K block's 16 accumulator lanes live in four registers, lane j in register j / 4
// (register q holds the pairs of K 8q .. 8q + 7). Weights are widened from bytes to 32-bit lanes
// (lane j = the pair 2j, 2j + 1), split into even and odd elements and dequantized with one fma each.
#include <arm_neon.h>

#include "common/pairs_neon.h"
#include "weight_only/weight_only_kernels.h"

namespace shrike::dotprod {

namespace {

using neon::Pairs;
using neon::load_pairs;
using neon::reduce16;

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
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_pairs(x + r * k + b, q);
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

}  // namespace

void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  with_weight_only_types(p, [&](auto x, auto bits) {
    walk_2x2(r0, r1, c0, c1, [&](auto rows, auto cols, int64_t r, int64_t c) {
      block<decltype(rows)::value, decltype(cols)::value, decltype(x), decltype(bits)::value>(p, r, c);
    });
  });
}

}  // namespace shrike::dotprod
