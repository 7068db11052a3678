// How a GEMM variant walks its share of the output: the m rows in blocks, each block over the
// tiles [tile_begin, tile_end). The block height reaches the tile kernel as a compile-time
// constant (std::integral_constant), so the kernel can keep one accumulator set per row in
// registers and unroll over rows.
// Internal linkage on purpose: each ISA file instantiates these with its own target flags.
#pragma once
#include <cstdint>
#include <type_traits>

namespace shrike {
namespace {

template <int N>
using Count = std::integral_constant<int, N>;

// kernel(Count<MR>{}, i0, t) computes rows [i0, i0 + MR) of tile t; blocks of 4 rows, then
// one block of the 1-3 rows left.
template <typename RowsTileKernel>
inline void for_row_blocks_and_tiles(int64_t m, int64_t tile_begin, int64_t tile_end, RowsTileKernel kernel) {
  auto over_tiles = [&](auto rows, int64_t i0) {
    for (int64_t t = tile_begin; t < tile_end; ++t) kernel(rows, i0, t);
  };
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) over_tiles(Count<4>{}, i);
  switch (m - i) {
    case 3: return over_tiles(Count<3>{}, i);
    case 2: return over_tiles(Count<2>{}, i);
    case 1: return over_tiles(Count<1>{}, i);
  }
}

// Calls f(Count<r>{}) for a runtime r in [1, N].
template <int N, typename F>
inline void with_count(int r, F&& f) {
  if constexpr (N > 0) {
    if (r == N) return f(Count<N>{});
    with_count<N - 1>(r, f);
  }
}

// For register-blocked kernels that cover several tiles per call:
// kernel(Count<MR>{}, Count<NB>{}, i0, t, tiles) computes rows [i0, i0 + MR) of the `tiles`
// (<= NB) tiles starting at t. Row blocks of MaxRows, then one block of the rows left; within a
// row block, tile blocks of BlockTiles, then blocks of 2 (the last one may hold a single tile).
// Rows are the outer loop so a task's weight tiles stay in cache while every row block uses them.
template <int MaxRows, int BlockTiles, typename BlockKernel>
inline void for_row_blocks_and_tile_blocks(int64_t m, int64_t tile_begin, int64_t tile_end, BlockKernel kernel) {
  auto over_tiles = [&](auto rows, int64_t i0) {
    int64_t t = tile_begin;
    for (; t + BlockTiles <= tile_end; t += BlockTiles) kernel(rows, Count<BlockTiles>{}, i0, t, int64_t{BlockTiles});
    for (; t < tile_end; t += 2) kernel(rows, Count<2>{}, i0, t, tile_end - t < 2 ? tile_end - t : int64_t{2});
  };
  int64_t i = 0;
  for (; i + MaxRows <= m; i += MaxRows) over_tiles(Count<MaxRows>{}, i);
  if (i < m) with_count<MaxRows - 1>(static_cast<int>(m - i), [&](auto rows) { over_tiles(rows, i); });
}

// For kernels that take rows two at a time (smmla): kernel(Count<PAIRS>{}, row_a, row_b, t)
// computes the row pairs (row_a[j], row_b[j]), j < PAIRS, of tile t. Blocks of 4 rows form two
// pairs; an odd last row is paired with itself (the kernel stores it once).
template <typename PairsTileKernel>
inline void for_row_pairs_and_tiles(int64_t m, int64_t tile_begin, int64_t tile_end, PairsTileKernel kernel) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const int64_t a[2] = {i, i + 2}, b[2] = {i + 1, i + 3};
    for (int64_t t = tile_begin; t < tile_end; ++t) kernel(Count<2>{}, a, b, t);
  }
  for (; i < m; i += 2) {
    const int64_t a[1] = {i}, b[1] = {i + 1 < m ? i + 1 : i};
    for (int64_t t = tile_begin; t < tile_end; ++t) kernel(Count<1>{}, a, b, t);
  }
}

}  // namespace
}  // namespace shrike
