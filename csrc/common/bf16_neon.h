// float <-> bfloat16 for 4 lanes at a time, NEON. Include only from aarch64 ISA files.
// Internal linkage on purpose: the including files are built with different -march flags
// (armv8.6-a enables BF16 instructions), so their copies must never be merged by the linker.
#pragma once
#include <arm_neon.h>

#include "common/bf16.h"

namespace shrike::neon {
namespace {

inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const bf16* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

// Round to nearest even, as float_to_bf16 does for finite values.
inline uint16x4_t to_bf16(float32x4_t v) {
  uint32x4_t b = vreinterpretq_u32_f32(v);
  uint32x4_t lsb = vandq_u32(vshrq_n_u32(b, 16), vdupq_n_u32(1));
  return vshrn_n_u32(vaddq_u32(b, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
}

inline void store4(float* p, float32x4_t v) { vst1q_f32(p, v); }
inline void store4(bf16* p, float32x4_t v) { vst1_u16(p, to_bf16(v)); }

}  // namespace
}  // namespace shrike::neon
