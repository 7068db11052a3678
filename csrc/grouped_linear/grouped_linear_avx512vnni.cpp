// Grouped linear with 512-bit vpdpbusd. Decode (one or two rows) of int8 and 6-bit values, and of 4-bit
// values (or codebook indices) in groups of 32, walks one tile at a time as one sequential stream
// (linear/decode_avx512.h); everything else takes grouped_walk_x86.h's register blocks: two
// adjacent tiles (16 output columns) per zmm.
#include "grouped_linear/grouped_layout.h"
#include "grouped_linear/grouped_params_x86.h"
#include "grouped_linear/grouped_walk_x86.h"
#include "linear/decode_avx512.h"
#include "linear/epilogue_avx512.h"

namespace shrike::avx512vnni {
namespace {

template <int BITS, bool MIN, bool CB, int MR>
__attribute__((noinline)) void grouped_decode_tile(const GroupedProblem& p, int64_t t) {
  const GroupedWeight& wt = p.w;
  const int64_t groups = wt.k / wt.group, blocks = wt.k / kGroupedActivationBlock, param_bytes = grouped_param_bytes(wt);
  const uint8_t* w = wt.packed + t * grouped_tile_bytes(wt);
  const uint8_t* header = w;  // the superblock's d (factored)
  const bool factored = grouped_factored(wt);
  __m256 d = _mm256_setzero_ps(), dmin = _mm256_setzero_ps();  // a factored superblock's, widened once
  const __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kGroupedCodebookUnsigned.level)));
  __m256 acc[MR];
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    if (grouped_opens_superblock(wt, g)) {
      header = w, w += grouped_header_bytes(wt);
      d = load_header(header);
      if constexpr (MIN) dmin = load_header(header + 2 * kTileRows);
    }
    const int8_t* x[MR];
    __m256i isum[MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      x[r] = p.q + r * wt.k + g * wt.group;
      isum[r] = _mm256_set1_epi32(start_factor<BITS, MIN, CB>() * p.group_sum[r * groups + g]);
    }
    if constexpr (BITS == 8) byte_group<MR>(w, grouped_value_bytes(wt.group, 8), x, isum);
    else if constexpr (BITS == 6) sextet_group<MR>(w, wt.group, x, isum);
    else nibble_group<MR, CB>(w, grouped_value_bytes(wt.group, 4), x, isum, levels);
    __m256 scale = factored ? factored_params(w, d) : load_params(w, header, wt.params);
    __m256 min = !MIN ? _mm256_setzero_ps()
                 : factored ? factored_params(w + param_bytes, dmin) : load_params(w + param_bytes, header, wt.params);
    w += MIN ? 2 * param_bytes : param_bytes;
    const int64_t b = g * wt.group / kGroupedActivationBlock;
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {
      __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(scale, _mm256_set1_ps(p.x_scale[r * blocks + b])),
                                 acc[r]);
      if constexpr (MIN) a = _mm256_fmadd_ps(_mm256_set1_ps(p.x_min[r * groups + g]), min, a);
      acc[r] = a;
    }
  }
  const TileColumns c = tile_columns(wt.n, p.bias, t);
  _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)  // acc + bias, rounded once
    store_tile_row(p.out, p.out_dtype, r * p.out_stride + c.col, _mm256_fmadd_ps(acc[r], _mm256_set1_ps(1.f), c.bias), c.valid);
}

template <int BITS, bool MIN, bool CB = false>
void grouped_decode(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  for_decode_tiles(p.m, tile_begin, tile_end, [&](auto rows, int64_t t) { grouped_decode_tile<BITS, MIN, CB, rows>(p, t); });
}

}  // namespace

void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  if (p.m <= 2 && p.w.bits == 8) {
    if (p.w.has_min) return grouped_decode<8, true>(p, tile_begin, tile_end);
    return grouped_decode<8, false>(p, tile_begin, tile_end);
  }
  if (p.m <= 2 && p.w.bits == 6) {
    if (p.w.has_min) return grouped_decode<6, true>(p, tile_begin, tile_end);
    return grouped_decode<6, false>(p, tile_begin, tile_end);
  }
  if (p.m <= 2 && p.w.group == 32) {
    if (p.w.codebook) return grouped_decode<4, false, true>(p, tile_begin, tile_end);
    if (p.w.has_min) return grouped_decode<4, true>(p, tile_begin, tile_end);
    return grouped_decode<4, false>(p, tile_begin, tile_end);
  }
  grouped_walk<ZmmLanes>(p, tile_begin, tile_end);
}

}  // namespace shrike::avx512vnni
