// What the dense_linear dispatcher (dense.cpp) hands to each ISA variant, and the two reduction
// orders: the lanes order, which every SIMD variant follows so that all of them give the same bits,
// and the tile order of the AMX-BF16 unit, which the amx variant follows for bf16 x bf16. Each
// depends only on K, so every variant is batch-invariant.
//
// Lanes order of one output y[r, c]:
//   K is taken in blocks of 32 (the last block zero-padded). Accumulator lane j (0..15) adds,
//   for each block b in order, with fused multiply-adds:
//     acc[j] = fma(x[32b + 2j + 1], w[32b + 2j + 1], acc[j]);
//     acc[j] = fma(x[32b + 2j],     w[32b + 2j],     acc[j]);
//   (the pair order of vdpbf16ps, so the AVX-512 BF16 variant follows it with one instruction).
//   The 16 lanes are then summed pairwise: lane j += lane j + 8, then + 4, + 2, + 1.
//   y = acc[0] + bias[c], rounded once to the output dtype.
//
// Tile order (bf16 x bf16 at the amx level; a tdpbf16ps accumulation per 32 K):
//   K is taken in tiles of 32 (the last zero-padded), in order. Starting from acc = 0, each tile
//   adds acc = amx_bf16_step(acc, x[32t..32t + 31], w[32t..32t + 31], 16) (common/amx_bf16_order.h:
//   even and odd fma chains over the 16 pairs, acc + (even + odd), denormals flushed).
//   y = acc + bias[c], rounded once to the output dtype.
#pragma once
#include <cstdint>

#include "common/bf16.h"
#include "common/dtype.h"
#include "common/register_blocks.h"
#include "dense/dense.h"

namespace shrike {

constexpr int64_t kDenseBlockK = 32;
constexpr int kDenseLanes = 16;

struct DenseProblem {
  const void* x;  // (m, k)
  DType x_dtype;
  const void* w;  // (n, k) row-major, or bf16 tiles (dense_tiles.h)
  DType w_dtype;
  DenseLayout w_layout;
  const float* bias;  // (n,) or null
  void* out;          // (m, n)
  DType out_dtype;
  int64_t m, n, k;
  // Tile order only, set by the dispatcher for the amx kernel: x as activation tiles of
  // rows = min(m, 16) rows, (ceil(m / rows), kp / 32, rows, 32) bf16, rows past m and K past k zero.
  const bf16* x_tiles;
};

// Each variant computes rows [r0, r1) x outputs [c0, c1). The avx512bf16 variant needs bf16
// activations when the weights are bf16 (the dispatcher never hands it fp32 ones then).
// dense_block: the lanes order on a rows weight. dense_tile_block: the tile order, bf16 x bf16 in
// either layout; for the amx one r0 is a multiple of min(m, 16) and c0 of 16.
#define SHRIKE_DECLARE_DENSE_BLOCK \
  void dense_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
#define SHRIKE_DECLARE_DENSE_TILE_BLOCK \
  void dense_tile_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

namespace ref { SHRIKE_DECLARE_DENSE_BLOCK SHRIKE_DECLARE_DENSE_TILE_BLOCK }
namespace avx2 { SHRIKE_DECLARE_DENSE_BLOCK }
namespace avx512bf16 { SHRIKE_DECLARE_DENSE_BLOCK }
namespace amx { SHRIKE_DECLARE_DENSE_TILE_BLOCK }
namespace dotprod { SHRIKE_DECLARE_DENSE_BLOCK }

#undef SHRIKE_DECLARE_DENSE_BLOCK
#undef SHRIKE_DECLARE_DENSE_TILE_BLOCK

namespace {
// Internal linkage: each ISA translation unit keeps its own copy (see bf16_avx2.h).
inline void dense_store(const DenseProblem& p, int64_t r, int64_t c, float sum) {
  float y = p.bias ? sum + p.bias[c] : sum;
  if (p.out_dtype == DType::f32)
    static_cast<float*>(p.out)[r * p.n + c] = y;
  else
    static_cast<bf16*>(p.out)[r * p.n + c] = float_to_bf16(y);
}

// The call's dtype pair as types: typed(XT{}, WT{}), each float or bf16.
template <typename Typed>
inline void with_dtypes(const DenseProblem& p, Typed typed) {
  const bool xf = p.x_dtype == DType::f32, wf = p.w_dtype == DType::f32;
  if (xf && wf) return typed(float{}, float{});
  if (xf) return typed(float{}, bf16{});
  if (wf) return typed(bf16{}, float{});
  typed(bf16{}, bf16{});
}

}  // namespace

}  // namespace shrike
