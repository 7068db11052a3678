// Bias loads and output stores for 4 columns of a tile, NEON (shared by dotprod and i8mm).
// Internal linkage on purpose: the including files are built with different -march flags
// (armv8.6-a enables BF16 instructions), so their copies must never be merged by the linker.
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "common/bf16_neon.h"
#include "common/dtype.h"

namespace shrike::neon {
namespace {

// Columns of an 8-wide tile that exist in half h (0 or 1) when `valid` of 8 do.
inline int half_valid(int valid, int h) {
  int v = valid - 4 * h;
  return v < 0 ? 0 : v > 4 ? 4 : v;
}

inline float32x4_t load_bias(const float* bias, int64_t col, int valid) {
  if (!bias || valid == 0) return vdupq_n_f32(0.f);
  if (valid == 4) return vld1q_f32(bias + col);
  float tmp[4] = {};
  std::memcpy(tmp, bias + col, valid * sizeof(float));
  return vld1q_f32(tmp);
}

inline void store4(void* out, DType dt, int64_t offset, float32x4_t y, int valid) {
  if (valid == 0) return;
  if (dt == DType::f32) {
    float* dst = static_cast<float*>(out) + offset;
    if (valid == 4) return vst1q_f32(dst, y);
    float tmp[4];
    vst1q_f32(tmp, y);
    std::memcpy(dst, tmp, valid * sizeof(float));
  } else {
    uint16_t* dst = static_cast<uint16_t*>(out) + offset;
    if (valid == 4) return vst1_u16(dst, to_bf16(y));
    uint16_t tmp[4];
    vst1_u16(tmp, to_bf16(y));
    std::memcpy(dst, tmp, valid * sizeof(uint16_t));
  }
}

inline int tile_valid(int64_t n, int64_t t) {
  int64_t v = n - t * 8;
  return static_cast<int>(v < 8 ? v : 8);
}

}  // namespace
}  // namespace shrike::neon
