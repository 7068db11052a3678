// How the float kernels (dense_linear, weight_only_linear) walk their output in register blocks,
// shared so that every variant of both ops takes the same shapes.
#pragma once
#include <cstdint>
#include <type_traits>

// Before each loop over a register block: fully unrolled, the accumulators stay in registers
// (GCC otherwise keeps a stack copy of them up to date on every step).
#define SHRIKE_UNROLL _Pragma("GCC unroll 16")

namespace shrike {
namespace {

template <int N>
using BlockCount = std::integral_constant<int, N>;

// The walk of the variants with 2 x 2 blocks (AVX2, NEON): one row (decode) takes 4 outputs at a
// time; more rows take 2 x 2 blocks, then the remainders.
// block(BlockCount<ROWS>{}, BlockCount<COLS>{}, r, c) computes rows [r, r + ROWS) x outputs [c, c + COLS).
template <typename Block>
inline void walk_2x2(int64_t r0, int64_t r1, int64_t c0, int64_t c1, Block block) {
  if (r1 - r0 == 1) {
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4) block(BlockCount<1>{}, BlockCount<4>{}, r0, c);
    for (; c < c1; ++c) block(BlockCount<1>{}, BlockCount<1>{}, r0, c);
    return;
  }
  int64_t c = c0;
  for (; c + 2 <= c1; c += 2) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) block(BlockCount<2>{}, BlockCount<2>{}, r, c);
    if (r < r1) block(BlockCount<1>{}, BlockCount<2>{}, r, c);
  }
  if (c < c1) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) block(BlockCount<2>{}, BlockCount<1>{}, r, c);
    if (r < r1) block(BlockCount<1>{}, BlockCount<1>{}, r, c);
  }
}

// The walk of the AVX-512 variants: rows in blocks of 4 (each weight load feeds 4 rows), outputs in
// blocks of 4; one row (decode) takes 8 outputs at a time so enough weight loads are in flight.
template <typename Block>
inline void walk_4x4(int64_t r0, int64_t r1, int64_t c0, int64_t c1, Block block) {
  if (r1 - r0 == 1) {
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) block(BlockCount<1>{}, BlockCount<8>{}, r0, c);
    for (; c < c1; ++c) block(BlockCount<1>{}, BlockCount<1>{}, r0, c);
    return;
  }
  auto rows = [&](auto cols, int64_t c) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) block(BlockCount<4>{}, cols, r, c);
    switch (r1 - r) {
      case 3: block(BlockCount<3>{}, cols, r, c); break;
      case 2: block(BlockCount<2>{}, cols, r, c); break;
      case 1: block(BlockCount<1>{}, cols, r, c); break;
      default: break;
    }
  };
  int64_t c = c0;
  for (; c + 4 <= c1; c += 4) rows(BlockCount<4>{}, c);
  for (; c < c1; ++c) rows(BlockCount<1>{}, c);
}

}  // namespace
}  // namespace shrike
