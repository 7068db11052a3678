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

// svmmla operands for a pass (see columns_per_pass): K steps a and b of R columns x 4 K each,
// zipped per 32-bit element into (column, 8 K) rows, two columns per 128-bit segment; `first`
// holds columns 0..R/2-1 of the pass, `second` the rest. Returned by value: through reference
// parameters clang 19 kept the two operands in a stack slot (stored as int32, reloaded as int8).
inline svint8_t mmla_columns_first(svint8_t a, svint8_t b) {
  return svreinterpret_s8_s32(svzip1_s32(svreinterpret_s32_s8(a), svreinterpret_s32_s8(b)));
}
inline svint8_t mmla_columns_second(svint8_t a, svint8_t b) {
  return svreinterpret_s8_s32(svzip2_s32(svreinterpret_s32_s8(a), svreinterpret_s32_s8(b)));
}

// 8 K of row a then 8 K of row b, in every 128-bit segment: svmmla's (2 rows, 8 K) operand.
// Loads of 8 bytes only: a row's last K step must not read past its end.
inline svint8_t mmla_rows(const int8_t* a, const int8_t* b) {
  const svbool_t eight = svwhilelt_b8(int64_t{0}, int64_t{8});
  return svreinterpret_s8_s64(
      svtrn1_s64(svreinterpret_s64_s8(svld1rq_s8(eight, a)), svreinterpret_s64_s8(svld1rq_s8(eight, b))));
}

// svmmla results of `first` and `second` (segments [a c, a c+1, b c, b c+1]) back in column
// order: row a's sums, then row b's.
inline void mmla_rows_out(svint32_t first, svint32_t second, svint32_t& row_a, svint32_t& row_b) {
  svint64_t f = svreinterpret_s64_s32(first), s = svreinterpret_s64_s32(second);
  row_a = svreinterpret_s32_s64(svuzp1_s64(f, s));
  row_b = svreinterpret_s32_s64(svuzp2_s64(f, s));
}

}  // namespace
}  // namespace shrike::sve2
