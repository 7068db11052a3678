// The register-blocked grouped kernel of the x86 vpdpbusd variants, written once over the lane
// types of linear/tile_walk_x86.h (ZmmLanes: two 8-row tiles per zmm; YmmLanes: one per ymm).
// Per group each accumulator sums exactly in int32: 4- and 6-bit values are the unsigned operand as
// stored (w + 8 or w + 32 without mins: the accumulator starts at -8 or -32 times sum(q)); int8 values
// are flipped to w + 128, codebook indices (CB) looked up as level + 128, and the accumulator starts at
// -128 * sum(q).
// Internal linkage on purpose: each ISA file instantiates this with its own target flags.
#pragma once
#include <cstdint>

#include "grouped_linear/grouped_layout.h"
#include "linear/tile_walk_x86.h"

namespace shrike {
namespace {

// The 8 scales (or mins) at `offset` of each tile of w in the weight's form; a factored weight's d (or
// dmin) at `header`.
template <typename L>
typename L::F load_params(const uint8_t* const* w, int64_t offset, int64_t header, GroupedParams form) {
  if (form == GroupedParams::kFloat16) return L::load_f16(w, offset);
  if (form == GroupedParams::kFactored) return L::mul(L::load_f16(w, header), L::load_i8(w, offset));  // exact
  return L::as_float(L::load(w, offset));
}

// What the accumulator of a group starts at, times the activations' group sum: the stored values' offset.
template <int BITS, bool MIN, bool CB = false>
constexpr int32_t start_factor() {
  return BITS == 8 || CB ? -128 : MIN ? 0 : BITS == 4 ? -8 : -32;
}

template <typename L, int BITS, bool MIN, bool CB, int MR, int NB>
__attribute__((noinline)) void grouped_rows_x_tiles(const GroupedProblem& p, int64_t i0, int64_t t, int64_t tiles) {
  using I = typename L::I;
  using F = typename L::F;
  constexpr int NV = NB / L::kTiles;
  const GroupedWeight& wt = p.w;
  const int64_t groups = wt.k / wt.group, blocks = wt.k / kGroupedActivationBlock, param_bytes = grouped_param_bytes(wt);
  const uint8_t* w[NV][L::kTiles];
  block_tiles<L, NV>(wt.packed, grouped_tile_bytes(wt), t, tiles, w);
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * wt.k;
  const I levels = L::broadcast16(kGroupedCodebookUnsigned.level);
  alignas(64) float acc[MR][NV][L::kLanes] = {};
  int64_t offset = 0, header = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (grouped_opens_superblock(wt, g)) header = offset, offset += grouped_header_bytes(wt);
    I isum[MR][NV];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      I start = L::splat(start_factor<BITS, MIN, CB>() * p.group_sum[(i0 + r) * groups + g]);
      _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) isum[r][j] = start;
    }
    const int64_t k0 = g * wt.group;
    if constexpr (BITS == 8) {
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 4, offset += 32)
        _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
          I v = L::flip(L::load(w[j], offset));
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], v, q[r] + kb);
        }
    } else if constexpr (BITS == 6) {
      // per 16 K: two nibble steps and their high-bit byte plane
      const int64_t top = offset + grouped_value_bytes(wt.group, 4);
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 16, offset += 64)
        _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
          I h = L::load(w[j], top + (kb - k0) * 2);
          I v0 = L::load(w[j], offset), v1 = L::load(w[j], offset + 32);
          I u = L::or_(L::low4(v0), L::template bits_at4<0>(h));
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], u, q[r] + kb);
          u = L::or_(L::high4(v0), L::template bits_at4<2>(h));
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], u, q[r] + kb + 4);
          u = L::or_(L::low4(v1), L::template bits_at4<4>(h));
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], u, q[r] + kb + 8);
          u = L::or_(L::high4(v1), L::template bits_at4<6>(h));
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], u, q[r] + kb + 12);
        }
      offset = top + grouped_value_bytes(wt.group, 2);
    } else {
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 8, offset += 32)
        _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
          I v = L::load(w[j], offset);
          I lo = CB ? L::lookup16(levels, L::low4(v)) : L::low4(v);
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], lo, q[r] + kb);
          I hi = CB ? L::lookup16(levels, L::high4(v)) : L::high4(v);
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], hi, q[r] + kb + 4);
        }
    }
    const int64_t b = k0 / kGroupedActivationBlock;
    _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
      F scale = load_params<L>(w[j], offset, header, wt.params);
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        F a = L::fmadd(L::to_float(isum[r][j]), L::mul(scale, L::splat(p.x_scale[(i0 + r) * blocks + b])),
                       L::load_acc(acc[r][j]));
        if constexpr (MIN)
          a = L::fmadd(L::splat(p.x_min[(i0 + r) * groups + g]), load_params<L>(w[j], offset + param_bytes, header + 2 * kTileRows, wt.params), a);
        L::store_acc(acc[r][j], a);
      }
    }
    offset += MIN ? 2 * param_bytes : param_bytes;
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
    int64_t col;
    int valid = block_columns<L>(wt.n, t, tiles, j, col);
    if (valid == 0) break;  // not in the loop condition: a runtime bound stops the unrolling
    F bias = L::load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      F y = L::fmadd(L::load_acc(acc[r][j]), L::splat(1.f), bias);  // acc + bias, rounded once
      L::store_row(p.out, p.out_dtype, (i0 + r) * p.out_stride + col, y, valid);
    }
  }
}

template <typename L, int BITS, bool MIN, bool CB = false>
void grouped_walk_of(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    grouped_rows_x_tiles<L, BITS, MIN, CB, rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, L::kDecodeTiles>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<L::kPrefillRows, L::kPrefillTiles>(p.m, tile_begin, tile_end, kernel);
}

template <typename L>
void grouped_walk(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  if (p.w.bits == 8) {
    if (p.w.has_min) return grouped_walk_of<L, 8, true>(p, tile_begin, tile_end);
    return grouped_walk_of<L, 8, false>(p, tile_begin, tile_end);
  }
  if (p.w.bits == 6) {
    if (p.w.has_min) return grouped_walk_of<L, 6, true>(p, tile_begin, tile_end);
    return grouped_walk_of<L, 6, false>(p, tile_begin, tile_end);
  }
  if (p.w.codebook) return grouped_walk_of<L, 4, false, true>(p, tile_begin, tile_end);
  if (p.w.has_min) return grouped_walk_of<L, 4, true>(p, tile_begin, tile_end);
  grouped_walk_of<L, 4, false>(p, tile_begin, tile_end);
}

}  // namespace
}  // namespace shrike
