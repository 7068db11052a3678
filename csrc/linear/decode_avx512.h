// Decode (one or two activation rows) on AVX-512 for the tile layouts of W4A8, W8A8 and grouped
// weights (4-bit values in groups of 32, 6-bit and int8 values in groups of 16 or 32): one 8-row tile at a
// time over all of K, so each thread reads its share of the weights as one sequential stream. The
// register-blocked walk of tile_walk_x86.h keeps 8 tiles (8 streams) in flight per thread for its
// accumulators; on Zen 4 the hardware prefetchers serve that slower than one stream
// (benchmarks/README.md).
//
// A 64-byte load holds two consecutive 32-byte K steps of one tile: lanes 0-7 the first step's
// 8 rows, lanes 8-15 the second's. Each vpdpbusd therefore needs two activation dwords, one per
// half, which one vpermd picks from the row's 32 activation bytes of that load pair. (Spreading the
// activations into that form once per call was 40% slower: the 8x larger copy competes with the
// weight stream for L1.) The two halves of an accumulator are folded at the end of each group,
// so the integer group sums and every float step after them are the reference's (linear.h,
// grouped_linear.h).
// Internal linkage on purpose: compiled with AVX-512 flags only.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "common/prefetch_x86.h"
#include "linear/epilogue_avx512.h"
#include "linear/gemm_driver.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::avx512vnni {
namespace {

// The two cache lines 4 KiB past the 128 bytes a step reads (common/prefetch_x86.h).
inline void prefetch_ahead(const uint8_t* w) {
  prefetch_stream(w);
  prefetch_stream(w + 64);
}

// Activation dword i of a 32-byte block in lanes 0-7 and dword j in lanes 8-15.
inline __m512i dword_pairs(int i, int j) {
  return _mm512_set_epi32(j, j, j, j, j, j, j, j, i, i, i, i, i, i, i, i);
}

// The 8 int32 of one tile's rows: the two halves of s added.
inline __m256i fold_halves(__m512i s) {
  return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

// The output columns of tile t: the first one, how many of its 8 exist, and their bias (0 without one).
struct TileColumns {
  int64_t col;
  int valid;
  __m256 bias;
};
inline TileColumns tile_columns(int64_t n, const float* bias, int64_t t) {
  const int64_t col = t * kTileRows;
  const int valid = static_cast<int>(n - col < kTileRows ? n - col : kTileRows);
  return {col, valid, _mm512_castps512_ps256(load_bias(bias, col, valid))};
}

inline void store_tile_row(void* out, DType dt, int64_t offset, __m256 y, int valid) {
  store_row(out, dt, offset, _mm512_castps256_ps512(y), valid);
}

// kernel(Count<MR>{}, t) for every tile t of [tile_begin, tile_end), MR = m (1 or 2).
template <typename TileKernel>
inline void for_decode_tiles(int64_t m, int64_t tile_begin, int64_t tile_end, TileKernel kernel) {
  with_count<2>(static_cast<int>(m), [&](auto rows) {
    for (int64_t t = tile_begin; t < tile_end; ++t) kernel(rows, t);
  });
}

// isum[r] += the int32 dot products of one group's 4-bit values (group_bytes = 4 * group, a multiple
// of 128) with row r's activations x[r] (the group's first K); w advances past the values. Four
// accumulators per row keep the vpdpbusd chains short. With CB the nibbles are indices that select
// the unsigned bytes of `levels` (16 in every 128-bit lane).
template <int MR, bool CB = false>
inline void nibble_group(const uint8_t*& w, int64_t group_bytes, const int8_t* const (&x)[MR], __m256i (&isum)[MR],
                         __m512i levels = _mm512_setzero_si512()) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const __m512i low0 = dword_pairs(0, 2), high0 = dword_pairs(1, 3), low1 = dword_pairs(4, 6), high1 = dword_pairs(5, 7);
  __m512i sums[MR][4];
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; ++a) sums[r][a] = _mm512_setzero_si512();
  for (int64_t b = 0; b < group_bytes; b += 128, w += 128) {
    // 128 bytes: K steps 0-3 of 8 K each; v0 holds steps 0 and 1, v1 steps 2 and 3
    prefetch_ahead(w);
    __m512i v0 = _mm512_loadu_si512(w), v1 = _mm512_loadu_si512(w + 64);
    __m512i lo0 = _mm512_and_si512(v0, mask), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), mask);
    __m512i lo1 = _mm512_and_si512(v1, mask), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), mask);
    if constexpr (CB) {
      lo0 = _mm512_shuffle_epi8(levels, lo0), hi0 = _mm512_shuffle_epi8(levels, hi0);
      lo1 = _mm512_shuffle_epi8(levels, lo1), hi1 = _mm512_shuffle_epi8(levels, hi1);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r] + b / 4)));
      sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], lo0, _mm512_permutexvar_epi32(low0, q));
      sums[r][1] = _mm512_dpbusd_epi32(sums[r][1], hi0, _mm512_permutexvar_epi32(high0, q));
      sums[r][2] = _mm512_dpbusd_epi32(sums[r][2], lo1, _mm512_permutexvar_epi32(low1, q));
      sums[r][3] = _mm512_dpbusd_epi32(sums[r][3], hi1, _mm512_permutexvar_epi32(high1, q));
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(sums[r][0], sums[r][1]), _mm512_add_epi32(sums[r][2], sums[r][3]));
    isum[r] = _mm256_add_epi32(isum[r], fold_halves(s));
  }
}

// The same for one group of 6-bit values (group 16 or 32): per 16 K, a 64-byte load of the nibbles of
// two steps, and the 32 bytes of their high-bit plane (after all of the group's nibbles) in both
// halves, the upper half's (the odd step's bits 4-7) shifted down by 4 first; w advances past the plane.
template <int MR>
inline void sextet_group(const uint8_t*& w, int64_t group, const int8_t* const (&x)[MR], __m256i (&isum)[MR]) {
  const __m512i mask = _mm512_set1_epi8(0x0f), top_mask = _mm512_set1_epi8(0x30);
  const __m512i odd_step_down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i low = dword_pairs(0, 2), high = dword_pairs(1, 3);
  const uint8_t* top = w + 4 * group;
  __m512i sums[MR][2];
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) sums[r][0] = sums[r][1] = _mm512_setzero_si512();
  for (int64_t c = 0; c < group; c += 16, w += 64, top += 32) {
    prefetch_ahead(w);
    const __m512i v = _mm512_loadu_si512(w);
    const __m512i h = _mm512_srlv_epi16(
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(top))), odd_step_down);
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_slli_epi16(h, 4), top_mask));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), mask),
                                       _mm512_and_si512(_mm512_slli_epi16(h, 2), top_mask));
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r] + c)));
      sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], lo, _mm512_permutexvar_epi32(low, q));
      sums[r][1] = _mm512_dpbusd_epi32(sums[r][1], hi, _mm512_permutexvar_epi32(high, q));
    }
  }
  w = top;
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)
    isum[r] = _mm256_add_epi32(isum[r], fold_halves(_mm512_add_epi32(sums[r][0], sums[r][1])));
}

// The same for int8 values (group_bytes = 8 * group, a multiple of 128; W8A8's group is the whole
// row), stored signed: they are flipped to w + 128 for the unsigned operand, so isum[r] must start
// at -128 * sum(q) of the group.
template <int MR>
inline void byte_group(const uint8_t*& w, int64_t group_bytes, const int8_t* const (&x)[MR], __m256i (&isum)[MR]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i first = dword_pairs(0, 1), second = dword_pairs(2, 3);
  __m512i sums[MR][2];
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) sums[r][0] = sums[r][1] = _mm512_setzero_si512();
  for (int64_t b = 0; b < group_bytes; b += 128, w += 128) {
    // 128 bytes: K steps 0-3 of 4 K each; v0 holds steps 0 and 1, v1 steps 2 and 3
    prefetch_ahead(w);
    __m512i v0 = _mm512_xor_si512(_mm512_loadu_si512(w), flip), v1 = _mm512_xor_si512(_mm512_loadu_si512(w + 64), flip);
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r] + b / 8)));
      sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], v0, _mm512_permutexvar_epi32(first, q));
      sums[r][1] = _mm512_dpbusd_epi32(sums[r][1], v1, _mm512_permutexvar_epi32(second, q));
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)
    isum[r] = _mm256_add_epi32(isum[r], fold_halves(_mm512_add_epi32(sums[r][0], sums[r][1])));
}

template <int MR>
__attribute__((noinline)) void w4a8_decode_tile(const W4A8Problem& p, int64_t t) {
  const int64_t groups = p.k / p.group, group_bytes = 4 * p.group;
  const uint8_t* w = p.packed + t * w4a8_tile_bytes(p.k, p.group);
  __m256 acc[MR];
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* x[MR];
    __m256i isum[MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      x[r] = p.q + r * p.k + g * p.group;
      isum[r] = _mm256_set1_epi32(-8 * p.x_group_sum[r * groups + g]);
    }
    nibble_group<MR>(w, group_bytes, x, isum);
    __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w));
    __m256 wsum = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 32))));
    w += 48;
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      // as tile_walk_x86.h: exact in float for groups up to 128
      __m256 exact = _mm256_fnmadd_ps(_mm256_set1_ps(static_cast<float>(p.x_zero[r])), wsum, _mm256_cvtepi32_ps(isum[r]));
      acc[r] = _mm256_fmadd_ps(exact, scale, acc[r]);
    }
  }
  const TileColumns c = tile_columns(p.n, p.bias, t);
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)
    store_tile_row(p.out, p.out_dtype, r * p.n + c.col, _mm256_fmadd_ps(acc[r], _mm256_set1_ps(p.x_scale[r]), c.bias), c.valid);
}

// Rows [0, p.m) (p.m <= 2) of tiles [tile_begin, tile_end).
inline void w4a8_decode(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  for_decode_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t t) { w4a8_decode_tile<rows>(p, t); });
}

template <int MR>
__attribute__((noinline)) void w8a8_decode_tile(const W8A8Problem& p, int64_t t) {
  const uint8_t* w = p.packed + t * w8a8_tile_bytes(p.k);
  const int8_t* x[MR];
  __m256i isum[MR];
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
    x[r] = p.q + r * p.k;
    isum[r] = _mm256_set1_epi32(static_cast<int32_t>(-128 * p.x_sum[r]));
  }
  byte_group<MR>(w, kTileRows * p.k, x, isum);  // the whole row is one group; int32 may wrap on the way, as in the walk
  __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w));
  const TileColumns c = tile_columns(p.n, p.bias, t);
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
    __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(_mm256_set1_ps(p.x_scale[r]), scale), c.bias);
    store_tile_row(p.out, p.out_dtype, r * p.n + c.col, y, c.valid);
  }
}

// Rows [0, p.m) (p.m <= 2) of tiles [tile_begin, tile_end); k % 16 == 0.
inline void w8a8_decode(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  for_decode_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t t) { w8a8_decode_tile<rows>(p, t); });
}

}  // namespace
}  // namespace shrike::avx512vnni
