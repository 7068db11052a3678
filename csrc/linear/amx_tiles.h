// Shared by the AMX int8 linear kernels: the output block shape, the tile
// multiply of one block and the rows left to the AVX-512 kernel.
// Internal linkage on purpose: compiled with AMX flags, never merged with other ISAs' code.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "common/amx_tile_config.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::amx {
namespace {

// Every tile 16 rows x 64 bytes (configure_tiles()): tmm0-3 int32 accumulators (16 x 16), tmm4-5
// activations (16 rows x 64 K), tmm6-7 weights (16 K quads x 16 columns x 4 K).
constexpr int64_t kBlockTiles = 4;  // 32 output columns: two column pairs of 8-row tiles

// sums[(row tile) * 2 + pair] = exact int32 sums over K [k_begin, k_end) of activation tiles a0
// (rows 0-15) and, with two_row_tiles, a1 (rows 16-31) against the weight panels b0 (column
// pair 0) and, with two_pairs, b1. Activation and weight panels hold 64 K per 1 KiB tile.
inline void multiply_block(const int8_t* a0, const int8_t* a1, const int8_t* b0, const int8_t* b1, int64_t k_begin,
                           int64_t k_end, bool two_row_tiles, bool two_pairs, int32_t (*sums)[16][16]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += 64) {
    _tile_loadd(4, a0 + k0 * 16, 64);
    _tile_loadd(6, b0 + k0 * 16, 64);
    _tile_dpbssd(0, 4, 6);
    if (two_pairs) {
      _tile_loadd(7, b1 + k0 * 16, 64);
      _tile_dpbssd(1, 4, 7);
    }
    if (two_row_tiles) {
      _tile_loadd(5, a1 + k0 * 16, 64);
      _tile_dpbssd(2, 5, 6);
      if (two_pairs) _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  _tile_stored(2, sums[2], 64);
  _tile_stored(3, sums[3], 64);
}

// The output columns of column pair j in a block of `tiles` tiles starting at t: the first one
// and how many of its 16 exist.
inline int pair_columns(int64_t n, int64_t t, int64_t tiles, int j, int64_t& col) {
  col = (t + 2 * j) * kTileRows;
  int64_t in_block = (tiles - 2 * j < 2 ? tiles - 2 * j : 2) * kTileRows;
  return static_cast<int>(n - col < in_block ? n - col : in_block);
}

// Rows [first, m) of a problem, for the AVX-512 kernel: those below the last whole 16-row tile.
inline int64_t out_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

inline W4A8Problem rows_from(const W4A8Problem& p, int64_t first) {
  W4A8Problem rest = p;
  rest.q += first * p.k;
  rest.x_scale += first;
  rest.x_zero += first;
  rest.x_group_sum += first * (p.k / p.group);
  rest.q_tiles = nullptr;
  rest.out = static_cast<char*>(p.out) + first * p.n * out_bytes(p.out_dtype);
  rest.m = p.m - first;
  return rest;
}

inline W8A8Problem rows_from(const W8A8Problem& p, int64_t first) {
  W8A8Problem rest = p;
  rest.q += first * p.k;
  rest.x_scale += first;
  rest.x_sum += first;
  rest.q_tiles = nullptr;
  rest.out = static_cast<char*>(p.out) + first * p.n * out_bytes(p.out_dtype);
  rest.m = p.m - first;
  return rest;
}

}  // namespace
}  // namespace shrike::amx
