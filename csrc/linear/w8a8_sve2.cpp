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

template <int MR>
void rows_x_pass(const W8A8Problem& p, int64_t i0, int64_t t, int64_t h, int64_t per_pass) {
  const int8_t* tile = reinterpret_cast<const int8_t*>(p.packed + t * w8a8_tile_bytes(p.k));
  const int8_t* w = tile + 4 * per_pass * h;
  const svbool_t all = svptrue_b8();
  const svbool_t bytes = svwhilelt_b8(int64_t{0}, 4 * per_pass);
  const svbool_t lanes = svwhilelt_b32(int64_t{0}, per_pass);
  const int8_t* q[4];
  for (int r = 0; r < 4; ++r) q[r] = p.q + (i0 + (r < MR ? r : 0)) * p.k;
  // Each row's four K steps go to four independent accumulators (summed after the loop; integer
  // sums are exact), so consecutive sdot do not wait on each other.
#define SHRIKE_DECLARE(r) \
  svint32_t isum##r = svdup_n_s32(0), isum##r##b = svdup_n_s32(0), isum##r##c = svdup_n_s32(0), isum##r##d = svdup_n_s32(0);
  SHRIKE_EACH_ROW(SHRIKE_DECLARE)
#undef SHRIKE_DECLARE
  for (int64_t k = 0; k < p.k; k += 16, w += 128) {
    svint8_t s0 = svld1_s8(bytes, w), s1 = svld1_s8(bytes, w + 32), s2 = svld1_s8(bytes, w + 64),
             s3 = svld1_s8(bytes, w + 96);
#define SHRIKE_DOT(r)                              \
  if constexpr (MR > r) {                          \
    svint8_t a = svld1rq_s8(all, q[r] + k);        \
    isum##r = svdot_lane_s32(isum##r, s0, a, 0);   \
    isum##r##b = svdot_lane_s32(isum##r##b, s1, a, 1); \
    isum##r##c = svdot_lane_s32(isum##r##c, s2, a, 2); \
    isum##r##d = svdot_lane_s32(isum##r##d, s3, a, 3); \
  }
    SHRIKE_EACH_ROW(SHRIKE_DOT)
#undef SHRIKE_DOT
  }
#define SHRIKE_SUM(r) \
  if constexpr (MR > r) isum##r = svadd_s32_x(all, svadd_s32_x(all, isum##r, isum##r##b), svadd_s32_x(all, isum##r##c, isum##r##d));
  SHRIKE_EACH_ROW(SHRIKE_SUM)
#undef SHRIKE_SUM
  svfloat32_t scale = svld1_f32(lanes, reinterpret_cast<const float*>(tile + kTileRows * p.k) + per_pass * h);
  svbool_t valid = valid_columns(p.n, t, h, per_pass);
  int64_t col = t * kTileRows + h * per_pass;
  svfloat32_t bias = load_bias(p.bias, col, valid);
#define SHRIKE_STORE(r)                                                                                    \
  if constexpr (MR > r) {                                                                                  \
    svfloat32_t combined = svmul_n_f32_x(lanes, scale, p.x_scale[i0 + r]);                                 \
    svfloat32_t y = svmla_f32_x(lanes, bias, svcvt_f32_s32_x(lanes, isum##r), combined);                   \
    store(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);                                             \
  }
  SHRIKE_EACH_ROW(SHRIKE_STORE)
#undef SHRIKE_STORE
}
#undef SHRIKE_EACH_ROW

// Row pairs (row_a[j], row_b[j]) x columns [hR, hR + R) of tile t with svmmla: (2 rows x 8 K) .
// (2 columns x 8 K)^T per 128-bit segment. Packed K steps s and s + 1 together hold 8 K of every
// column (mmla_columns_*). An odd last row is paired with itself and stored once.
template <int PAIRS>
void pairs_x_pass(const W8A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t, int64_t h,
                  int64_t per_pass) {
  const int8_t* tile = reinterpret_cast<const int8_t*>(p.packed + t * w8a8_tile_bytes(p.k));
  const int8_t* w = tile + 4 * per_pass * h;
  const svbool_t bytes = svwhilelt_b8(int64_t{0}, 4 * per_pass);
  const svbool_t lanes = svwhilelt_b32(int64_t{0}, per_pass);
  svint32_t first0 = svdup_n_s32(0), second0 = svdup_n_s32(0), first1 = svdup_n_s32(0), second1 = svdup_n_s32(0);
  for (int64_t k = 0; k < p.k; k += 8, w += 64) {
    svint8_t s0 = svld1_s8(bytes, w), s1 = svld1_s8(bytes, w + 32);
    svint8_t b_first = mmla_columns_first(s0, s1), b_second = mmla_columns_second(s0, s1);
    svint8_t a0 = mmla_rows(p.q + row_a[0] * p.k + k, p.q + row_b[0] * p.k + k);
    first0 = svmmla_s32(first0, a0, b_first);
    second0 = svmmla_s32(second0, a0, b_second);
    if constexpr (PAIRS > 1) {
      svint8_t a1 = mmla_rows(p.q + row_a[1] * p.k + k, p.q + row_b[1] * p.k + k);
      first1 = svmmla_s32(first1, a1, b_first);
      second1 = svmmla_s32(second1, a1, b_second);
    }
  }
  svfloat32_t scale = svld1_f32(lanes, reinterpret_cast<const float*>(tile + kTileRows * p.k) + per_pass * h);
  svbool_t valid = valid_columns(p.n, t, h, per_pass);
  int64_t col = t * kTileRows + h * per_pass;
  svfloat32_t bias = load_bias(p.bias, col, valid);
  auto store_row = [&](int64_t i, svint32_t isum) {
    svfloat32_t combined = svmul_n_f32_x(lanes, scale, p.x_scale[i]);
    store(p.out, p.out_dtype, i * p.n + col, svmla_f32_x(lanes, bias, svcvt_f32_s32_x(lanes, isum), combined), valid);
  };
  for (int j = 0; j < PAIRS; ++j) {
    svint32_t sums_a, sums_b;
    mmla_rows_out(j == 0 ? first0 : first1, j == 0 ? second0 : second1, sums_a, sums_b);
    store_row(row_a[j], sums_a);
    if (row_b[j] != row_a[j]) store_row(row_b[j], sums_b);
  }
}
}  // namespace

// A single decode row takes sdot; from two rows on, svmmla computes two rows per instruction.
void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
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
