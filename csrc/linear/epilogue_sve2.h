// Tile geometry and output stores for the vector-length-agnostic SVE2 kernels.
//
// A vector holds R = min(8, VL/32) int32 lanes, i.e. the columns of a tile handled at once;
// at VL = 128 a tile takes two passes over K (columns 0-3, then 4-7), from 256 bits on one
// (lanes past 8 are predicated off). Within a layout unit of 8 columns x 4 bytes, pass h
// reads bytes [4Rh, 4R(h+1)).
// Internal linkage on purpose: built with SVE2 flags, never to be merged with other copies.
#pragma once
#include <arm_sve.h>

#include <cstdint>

#include "common/dtype.h"

namespace shrike::sve2 {
namespace {

inline int64_t columns_per_pass() { return svcntw() < 8 ? static_cast<int64_t>(svcntw()) : 8; }

inline svfloat32_t load_bias(const float* bias, int64_t col, svbool_t valid) {
  return bias ? svld1_f32(valid, bias + col) : svdup_n_f32(0.f);
}

// Round to nearest even, as float_to_bf16 does for finite values.
inline void store(void* out, DType dt, int64_t offset, svfloat32_t y, svbool_t valid) {
  if (dt == DType::f32) return svst1_f32(valid, static_cast<float*>(out) + offset, y);
  svuint32_t b = svreinterpret_u32_f32(y);
  svuint32_t lsb = svand_n_u32_x(valid, svlsr_n_u32_x(valid, b, 16), 1);
  svuint32_t rounded = svadd_u32_x(valid, b, svadd_n_u32_x(valid, lsb, 0x7fff));
  svst1h_u32(valid, static_cast<uint16_t*>(out) + offset, svlsr_n_u32_x(valid, rounded, 16));
}

// Columns of tile t inside pass h that exist.
inline svbool_t valid_columns(int64_t n, int64_t t, int64_t h, int64_t per_pass) {
  int64_t first = t * 8 + h * per_pass;
  int64_t end = first + per_pass < n ? first + per_pass : n;
  return svwhilelt_b32(first, end);
}

}  // namespace
}  // namespace shrike::sve2
