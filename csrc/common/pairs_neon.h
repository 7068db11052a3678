// The float kernels' K-block order (dense/dense_kernels.h) on NEON: a block's 16 lanes in four
// registers, register q holding the pairs of K 8q .. 8q + 7 split into odd and even elements.
// Include only from aarch64 ISA files; internal linkage, as in bf16_neon.h.
#pragma once
#include <arm_neon.h>

#include "common/bf16.h"

namespace shrike::neon {
namespace {

struct Pairs {
  float32x4_t odd, even;
};

// Pairs 4q .. 4q + 3 of the block starting at p.
inline Pairs load_pairs(const bf16* p, int q) {
  uint32x4_t v = vreinterpretq_u32_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p) + 8 * q));
  return {vreinterpretq_f32_u32(vandq_u32(v, vdupq_n_u32(0xffff0000u))), vreinterpretq_f32_u32(vshlq_n_u32(v, 16))};
}

inline Pairs load_pairs(const float* p, int q) {
  float32x4x2_t v = vld2q_f32(p + 8 * q);  // val[0] = even elements, val[1] = odd
  return {v.val[1], v.val[0]};
}

// Lane j += lane j + 8, + 4, + 2, + 1.
inline float reduce16(const float32x4_t acc[4]) {
  float32x4_t a = vaddq_f32(acc[0], acc[2]), b = vaddq_f32(acc[1], acc[3]);
  float32x4_t s = vaddq_f32(a, b);
  float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
  return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

}  // namespace
}  // namespace shrike::neon
