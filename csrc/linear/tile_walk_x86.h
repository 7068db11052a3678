// The register-blocked W4A8 and W8A8 tile kernels of the x86 vpdpbusd variants, written once over
// a lane type: AVX-VNNI holds one 8-row tile per ymm (epilogue_avxvnni.h), AVX-512 VNNI two
// adjacent tiles per zmm (epilogue_avx512.h). A lane type L provides
//   I, F                 integer and float vectors of L::kLanes = 8 * L::kTiles lanes
//   load(w, offset)      32 bytes at `offset` of each of the kTiles tiles w[0..kTiles)
//   load_i16(w, offset)  8 int16 at `offset` of each tile, sign-extended to int32 lanes
//   load_f16(w, offset)  8 fp16 at `offset` of each tile, widened to float lanes
//   load_i8(w, offset)   8 int8 at `offset` of each tile, as float lanes
//   dpbusd(acc, u, q)    acc += u (unsigned bytes) . the four int8 at q in every lane
//   low4, high4, flip    nibble unpacking and the xor 0x80 that makes int8 weights unsigned
//   splat, to_float, fmadd, fnmadd, mul, load_acc, store_acc, load_bias, store_row
// and the block shapes: kDecodeRows x kDecodeTiles for m <= 2, kPrefillRows x kPrefillTiles else.
// Internal linkage on purpose: each ISA file instantiates these with its own target flags.
#pragma once
#include <cstdint>

#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike {
namespace {

// The kTiles tiles of vector j in a block of `tiles` tiles starting at t; past the last one the
// last tile is re-read (its lanes are computed but never stored).
template <typename L, int NV>
inline void block_tiles(const uint8_t* packed, int64_t tile_bytes, int64_t t, int64_t tiles,
                        const uint8_t* (&w)[NV][L::kTiles]) {
  _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j)
    _Pragma("GCC unroll 16") for (int s = 0; s < L::kTiles; ++s) {
      int64_t index = L::kTiles * j + s;
      w[j][s] = packed + (t + (index < tiles ? index : tiles - 1)) * tile_bytes;
    }
}

// The output columns of vector j in a block of `tiles` tiles starting at t: the first one and
// how many of its lanes exist (0 for a vector past the block's last tile).
template <typename L>
inline int block_columns(int64_t n, int64_t t, int64_t tiles, int j, int64_t& col) {
  col = (t + L::kTiles * j) * kTileRows;
  int64_t in_block = tiles - L::kTiles * j < L::kTiles ? tiles - L::kTiles * j : L::kTiles;
  if (in_block <= 0) return 0;
  return static_cast<int>(n - col < in_block * kTileRows ? n - col : in_block * kTileRows);
}

// W4A8: MR rows x NB tiles over all of K. The stored nibbles w + 8 are the unsigned operand, so
// every product is exact and nothing saturates; each group's accumulators start at
// -8 * sum(q), which removes the +8: the group ends holding sum(q * w) exactly.
// noinline: inlined into the driver's lambda, GCC keeps the accumulators in memory.
template <typename L, int MR, int NB>
__attribute__((noinline)) void w4a8_rows_x_tiles(const W4A8Problem& p, int64_t i0, int64_t t, int64_t tiles) {
  using I = typename L::I;
  using F = typename L::F;
  constexpr int NV = NB / L::kTiles;
  const int64_t groups = p.k / p.group;
  const uint8_t* w[NV][L::kTiles];
  block_tiles<L, NV>(p.packed, w4a8_tile_bytes(p.k, p.group), t, tiles, w);
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * p.k;
  alignas(64) float acc[MR][NV][L::kLanes] = {};
  int64_t offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    I isum[MR][NV];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      I start = L::splat(-8 * p.x_group_sum[(i0 + r) * groups + g]);
      _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) isum[r][j] = start;
    }
    for (int64_t kb = g * p.group; kb < (g + 1) * p.group; kb += 8, offset += 32) {
      // Low nibbles are K kb..kb+3, high ones kb+4..kb+7. Each vector's rows in turn: MR
      // independent accumulators between two updates of one.
      _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
        I v = L::load(w[j], offset);
        I lo = L::low4(v);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], lo, q[r] + kb);
        I hi = L::high4(v);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) L::dpbusd(isum[r][j], hi, q[r] + kb + 4);
      }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
      F scale = L::as_float(L::load(w[j], offset));
      F wsum = L::to_float(L::load_i16(w[j], offset + 32));
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        // sum((q - zero) * w) = sum(q * w) - zero * sum(w), done in float: for groups up to 128
        // every term and the result are integers below 2^24, so the fused step is exact and
        // equals float(isum) of the reference.
        F exact = L::fnmadd(L::splat(static_cast<float>(p.x_zero[i0 + r])), wsum, L::to_float(isum[r][j]));
        L::store_acc(acc[r][j], L::fmadd(exact, scale, L::load_acc(acc[r][j])));
      }
    }
    offset += 48;
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
    int64_t col;
    int valid = block_columns<L>(p.n, t, tiles, j, col);
    if (valid == 0) break;  // not in the loop condition: a runtime bound stops the unrolling
    F bias = L::load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      F y = L::fmadd(L::load_acc(acc[r][j]), L::splat(p.x_scale[i0 + r]), bias);
      L::store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, y, valid);
    }
  }
}

// W8A8: MR rows x NB tiles over all of K. The weights are flipped to w + 128 (xor 0x80, once per
// weight vector, shared by all rows) to be the unsigned operand; each accumulator starts at
// -128 * sum(q) and ends at sum(q * w) exactly (int32 wraps in between but the result fits).
template <typename L, int MR, int NB>
__attribute__((noinline)) void w8a8_rows_x_tiles(const W8A8Problem& p, int64_t i0, int64_t t, int64_t tiles) {
  using I = typename L::I;
  using F = typename L::F;
  constexpr int NV = NB / L::kTiles;
  const uint8_t* w[NV][L::kTiles];
  block_tiles<L, NV>(p.packed, w8a8_tile_bytes(p.k), t, tiles, w);
  const int8_t* q[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * p.k;
  I isum[MR][NV];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
    I start = L::splat(static_cast<int32_t>(-128 * p.x_sum[i0 + r]));
    _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) isum[r][j] = start;
  }
  int64_t offset = 0;
  for (int64_t k = 0; k < p.k; k += 4, offset += 32) {
    I v[NV];
    _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) v[j] = L::flip(L::load(w[j], offset));
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
      _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) L::dpbusd(isum[r][j], v[j], q[r] + k);
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < NV; ++j) {
    int64_t col;
    int valid = block_columns<L>(p.n, t, tiles, j, col);
    if (valid == 0) break;
    F scale = L::as_float(L::load(w[j], offset));
    F bias = L::load_bias(p.bias, col, valid);
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      F combined = L::mul(L::splat(p.x_scale[i0 + r]), scale);
      L::store_row(p.out, p.out_dtype, (i0 + r) * p.n + col, L::fmadd(L::to_float(isum[r][j]), combined, bias),
                   valid);
    }
  }
}

// Decode rows take wide tile blocks so that enough independent accumulators hide the vpdpbusd
// latency; prefill takes tall row blocks so each weight vector is reused by many rows.
template <typename L>
void w4a8_walk(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    w4a8_rows_x_tiles<L, rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, L::kDecodeTiles>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<L::kPrefillRows, L::kPrefillTiles>(p.m, tile_begin, tile_end, kernel);
}

template <typename L>
void w8a8_walk(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  auto kernel = [&](auto rows, auto block, int64_t i0, int64_t t, int64_t tiles) {
    w8a8_rows_x_tiles<L, rows, block>(p, i0, t, tiles);
  };
  if (p.m <= 2) return for_row_blocks_and_tile_blocks<2, L::kDecodeTiles>(p.m, tile_begin, tile_end, kernel);
  for_row_blocks_and_tile_blocks<L::kPrefillRows, L::kPrefillTiles>(p.m, tile_begin, tile_end, kernel);
}

}  // namespace
}  // namespace shrike
