#include <arm_sve.h>

#include "linear/epilogue_sve2.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::sve2 {

namespace {
// SVE vectors cannot live in arrays, so the up to four rows of a block are spelled out as
// variables 0..3 and rows past MR compile away.
#define SHRIKE_EACH_ROW(X) X(0) X(1) X(2) X(3)

// MR rows x columns [hR, hR + R) of tile t over all of K. sdot multiplies the stored w + 8
// (0..15, a valid int8) by q directly; the +8 is removed per group.
template <int MR>
void rows_x_pass(const W4A8Problem& p, int64_t i0, int64_t t, int64_t h, int64_t per_pass) {
  const int64_t groups = p.k / p.group;
  const uint8_t* w = p.packed + t * w4a8_tile_bytes(p.k, p.group);
  const svbool_t all = svptrue_b8();
  const svbool_t bytes = svwhilelt_b8(int64_t{0}, 4 * per_pass);
  const svbool_t lanes = svwhilelt_b32(int64_t{0}, per_pass);
  const int8_t* q[4];
  for (int r = 0; r < 4; ++r) q[r] = p.q + (i0 + (r < MR ? r : 0)) * p.k;
#define SHRIKE_DECLARE(r) svfloat32_t acc##r = svdup_n_f32(0.f);
  SHRIKE_EACH_ROW(SHRIKE_DECLARE)
#undef SHRIKE_DECLARE
  for (int64_t g = 0; g < groups; ++g) {
    // Each row's four sdot per K block go to four independent accumulators (summed per group;
    // integer sums are exact): one accumulator would make the group one chain of dependent sdot.
#define SHRIKE_DECLARE(r) \
  svint32_t isum##r = svdup_n_s32(0), isum##r##b = svdup_n_s32(0), isum##r##c = svdup_n_s32(0), isum##r##d = svdup_n_s32(0);
    SHRIKE_EACH_ROW(SHRIKE_DECLARE)
#undef SHRIKE_DECLARE
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 16, w += 64) {
      svuint8_t v0 = svld1_u8(bytes, w + 4 * per_pass * h), v1 = svld1_u8(bytes, w + 32 + 4 * per_pass * h);
      svint8_t lo0 = svreinterpret_s8_u8(svand_n_u8_x(bytes, v0, 0x0f));
      svint8_t hi0 = svreinterpret_s8_u8(svlsr_n_u8_x(bytes, v0, 4));
      svint8_t lo1 = svreinterpret_s8_u8(svand_n_u8_x(bytes, v1, 0x0f));
      svint8_t hi1 = svreinterpret_s8_u8(svlsr_n_u8_x(bytes, v1, 4));
      // Each 128-bit segment of a gets q[kb .. kb + 16): 32-bit lanes = K 0-3, 4-7 (step 0), 8-11, 12-15.
#define SHRIKE_DOT(r)                                 \
  if constexpr (MR > r) {                             \
    svint8_t a = svld1rq_s8(all, q[r] + kb);          \
    isum##r = svdot_lane_s32(isum##r, lo0, a, 0);     \
    isum##r##b = svdot_lane_s32(isum##r##b, hi0, a, 1); \
    isum##r##c = svdot_lane_s32(isum##r##c, lo1, a, 2); \
    isum##r##d = svdot_lane_s32(isum##r##d, hi1, a, 3); \
  }
      SHRIKE_EACH_ROW(SHRIKE_DOT)
#undef SHRIKE_DOT
    }
#define SHRIKE_SUM(r) \
  if constexpr (MR > r) isum##r = svadd_s32_x(all, svadd_s32_x(all, isum##r, isum##r##b), svadd_s32_x(all, isum##r##c, isum##r##d));
    SHRIKE_EACH_ROW(SHRIKE_SUM)
#undef SHRIKE_SUM
    svfloat32_t scale = svld1_f32(lanes, reinterpret_cast<const float*>(w) + per_pass * h);
    svint32_t wsum = svld1sh_s32(lanes, reinterpret_cast<const int16_t*>(w + 32) + per_pass * h);
    w += 48;
    // isum holds sum((w + 8) * q); the exact sum((q - zero) * w) is that minus 8 * sum(q) - zero * sum(w).
#define SHRIKE_GROUP(r)                                                                               \
  if constexpr (MR > r) {                                                                             \
    int64_t i = i0 + r;                                                                               \
    svint32_t correction = svmla_n_s32_x(lanes, svdup_n_s32(8 * p.x_group_sum[i * groups + g]), wsum, \
                                         p.x_zero[i]);                                                \
    acc##r = svmla_f32_x(lanes, acc##r, svcvt_f32_s32_x(lanes, svsub_s32_x(lanes, isum##r, correction)), scale); \
  }
    SHRIKE_EACH_ROW(SHRIKE_GROUP)
#undef SHRIKE_GROUP
  }
  svbool_t valid = valid_columns(p.n, t, h, per_pass);
  int64_t col = t * kTileRows + h * per_pass;
  svfloat32_t bias = load_bias(p.bias, col, valid);
#define SHRIKE_STORE(r)                                                            \
  if constexpr (MR > r) {                                                          \
    svfloat32_t y = svmla_n_f32_x(lanes, bias, acc##r, p.x_scale[i0 + r]);         \
    store(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);                     \
  }
  SHRIKE_EACH_ROW(SHRIKE_STORE)
#undef SHRIKE_STORE
}
#undef SHRIKE_EACH_ROW

// Row pairs (row_a[j], row_b[j]) x columns [hR, hR + R) of tile t with svmmla. A packed step's
// low nibbles are K 0-3 of each column and its high nibbles K 4-7: zipped (mmla_columns_*) they
// are the (column, 8 K) operand. The stored w + 8 (0..15) is a valid int8; the +8 is removed per
// group as in rows_x_pass. An odd last row is paired with itself and stored once.
template <int PAIRS>
void pairs_x_pass(const W4A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t, int64_t h,
                  int64_t per_pass) {
  const int64_t groups = p.k / p.group;
  const uint8_t* w = p.packed + t * w4a8_tile_bytes(p.k, p.group);
  const svbool_t bytes = svwhilelt_b8(int64_t{0}, 4 * per_pass);
  const svbool_t lanes = svwhilelt_b32(int64_t{0}, per_pass);
  svfloat32_t acc_a0 = svdup_n_f32(0.f), acc_b0 = svdup_n_f32(0.f), acc_a1 = svdup_n_f32(0.f),
              acc_b1 = svdup_n_f32(0.f);
  for (int64_t g = 0; g < groups; ++g) {
    svint32_t first0 = svdup_n_s32(0), second0 = svdup_n_s32(0), first1 = svdup_n_s32(0), second1 = svdup_n_s32(0);
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 8, w += 32) {
      svuint8_t v = svld1_u8(bytes, w + 4 * per_pass * h);
      svint8_t lo = svreinterpret_s8_u8(svand_n_u8_x(bytes, v, 0x0f)), hi = svreinterpret_s8_u8(svlsr_n_u8_x(bytes, v, 4));
      svint8_t b_first = mmla_columns_first(lo, hi), b_second = mmla_columns_second(lo, hi);
      svint8_t a0 = mmla_rows(p.q + row_a[0] * p.k + kb, p.q + row_b[0] * p.k + kb);
      first0 = svmmla_s32(first0, a0, b_first);
      second0 = svmmla_s32(second0, a0, b_second);
      if constexpr (PAIRS > 1) {
        svint8_t a1 = mmla_rows(p.q + row_a[1] * p.k + kb, p.q + row_b[1] * p.k + kb);
        first1 = svmmla_s32(first1, a1, b_first);
        second1 = svmmla_s32(second1, a1, b_second);
      }
    }
    svfloat32_t scale = svld1_f32(lanes, reinterpret_cast<const float*>(w) + per_pass * h);
    svint32_t wsum = svld1sh_s32(lanes, reinterpret_cast<const int16_t*>(w + 32) + per_pass * h);
    w += 48;
    // isum holds sum((w + 8) * q); the exact sum((q - zero) * w) is that minus 8 * sum(q) - zero * sum(w).
    auto add_group = [&](svfloat32_t acc, int64_t i, svint32_t isum) {
      svint32_t correction = svmla_n_s32_x(lanes, svdup_n_s32(8 * p.x_group_sum[i * groups + g]), wsum, p.x_zero[i]);
      return svmla_f32_x(lanes, acc, svcvt_f32_s32_x(lanes, svsub_s32_x(lanes, isum, correction)), scale);
    };
    svint32_t sums_a, sums_b;
    mmla_rows_out(first0, second0, sums_a, sums_b);
    acc_a0 = add_group(acc_a0, row_a[0], sums_a);
    acc_b0 = add_group(acc_b0, row_b[0], sums_b);
    if constexpr (PAIRS > 1) {
      mmla_rows_out(first1, second1, sums_a, sums_b);
      acc_a1 = add_group(acc_a1, row_a[1], sums_a);
      acc_b1 = add_group(acc_b1, row_b[1], sums_b);
    }
  }
  svbool_t valid = valid_columns(p.n, t, h, per_pass);
  int64_t col = t * kTileRows + h * per_pass;
  svfloat32_t bias = load_bias(p.bias, col, valid);
  auto store_row = [&](int64_t i, svfloat32_t acc) {
    store(p.out, p.out_dtype, i * p.n + col, svmla_n_f32_x(lanes, bias, acc, p.x_scale[i]), valid);
  };
  for (int j = 0; j < PAIRS; ++j) {
    store_row(row_a[j], j == 0 ? acc_a0 : acc_a1);
    if (row_b[j] != row_a[j]) store_row(row_b[j], j == 0 ? acc_b0 : acc_b1);
  }
}
}  // namespace

// A single decode row takes sdot; from two rows on, svmmla computes two rows per instruction.
void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  const int64_t per_pass = columns_per_pass();
  if (p.m < 2) {
    return for_row_blocks_and_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t i0, int64_t t) {
      for (int64_t h = 0; h < kTileRows / per_pass; ++h) rows_x_pass<rows>(p, i0, t, h, per_pass);
    });
  }
  for_row_pairs_and_tiles(p.m, tile_begin, tile_end, [&](auto pairs, const int64_t* row_a, const int64_t* row_b,
                                                          int64_t t) {
    for (int64_t h = 0; h < kTileRows / per_pass; ++h) pairs_x_pass<pairs>(p, row_a, row_b, t, h, per_pass);
  });
}

}  // namespace shrike::sve2
