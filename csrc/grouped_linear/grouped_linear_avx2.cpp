// Grouped linear with AVX2 maddubs for CPUs without vpdpbusd (Zen 2/3, Haswell..Coffee Lake).
// maddubs multiplies unsigned by signed bytes and adds pairs into saturating int16, so:
//   4-bit values are the unsigned operand as stored (0..15); a pair is at most 2 * 15 * 127 = 3810,
//   and the 8 maddubs of a 32-value group still sum exactly in int16 before widening (without mins
//   the stored values are w + 8, and -8 times the activations' group sum is added after);
//   6-bit values likewise (0..63, w + 32 without mins), widened after every two maddubs (a pair is at
//   most 2 * 63 * 127 = 16002);
//   int8 values go in as |w| with the sign moved onto the activation (pair at most 2 * 128 * 127),
//   widened to int32 after every maddubs; codebook indices the same after two lookups (pshufb) of
//   their level's magnitude and of the level itself, whose sign goes onto the activation.
// Both give the exact int32 dot of each group, so the float epilogue matches grouped_ref.cpp bit for bit.
#include <immintrin.h>

#include <algorithm>

#include "common/bf16_avx2.h"
#include "common/lanes_avx2.h"
#include "common/prefetch_x86.h"
#include "grouped_linear/grouped_layout.h"
#include "grouped_linear/grouped_params_x86.h"
#include "linear/epilogue_avx2.h"

namespace shrike::avx2 {

namespace {

// MR rows x one 8-column tile over all of K.
template <int BITS, bool MIN, bool CB, int MR>
void rows_x_tile(const GroupedProblem& p, int64_t i0, int64_t t) {
  const GroupedWeight& wt = p.w;
  const int64_t groups = wt.k / wt.group, blocks = wt.k / kGroupedActivationBlock;
  const uint8_t* w = wt.packed + t * grouped_tile_bytes(wt);
  const int64_t param_bytes = grouped_param_bytes(wt), header_bytes = grouped_header_bytes(wt);
  const uint8_t* header = w;  // the superblock's d (factored)
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kGroupedCodebook)));
  const int8_t* q[MR];
  for (int r = 0; r < MR; ++r) q[r] = p.q + (i0 + r) * wt.k;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    if (grouped_opens_superblock(wt, g)) header = w, w += header_bytes;
    const int64_t k0 = g * wt.group;
    __m256i isum[MR];
    if constexpr (CB) {
      for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 8, w += 32) {
        if ((kb & 8) == 0) prefetch_stream(w);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        const __m256i index[2] = {_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4)};
        for (int h = 0; h < 2; ++h) {
          const __m256i level = _mm256_shuffle_epi8(levels, index[h]);  // never 0, so sign keeps every q
          const __m256i magnitude = _mm256_sign_epi8(level, level);
          for (int r = 0; r < MR; ++r) {
            const __m256i signed_q = _mm256_sign_epi8(broadcast4(q[r] + kb + 4 * h), level);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_q), ones));
          }
        }
      }
    } else if constexpr (BITS == 4) {
      __m256i pair_sums[MR];
      for (int r = 0; r < MR; ++r) pair_sums[r] = _mm256_setzero_si256();
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 8, w += 32) {
        if ((kb & 8) == 0) prefetch_stream(w);
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int r = 0; r < MR; ++r) {
          pair_sums[r] = _mm256_add_epi16(pair_sums[r], _mm256_maddubs_epi16(lo, broadcast4(q[r] + kb)));
          pin_in_register(pair_sums[r]);
          pair_sums[r] = _mm256_add_epi16(pair_sums[r], _mm256_maddubs_epi16(hi, broadcast4(q[r] + kb + 4)));
          pin_in_register(pair_sums[r]);
        }
      }
      for (int r = 0; r < MR; ++r) {
        isum[r] = _mm256_madd_epi16(pair_sums[r], ones);
        if constexpr (!MIN) isum[r] = _mm256_add_epi32(isum[r], _mm256_set1_epi32(-8 * p.group_sum[(i0 + r) * groups + g]));
      }
    } else if constexpr (BITS == 6) {
      const __m256i top_mask = _mm256_set1_epi8(0x30);
      const uint8_t* top = w + grouped_value_bytes(wt.group, 4);  // the high-bit plane
      for (int r = 0; r < MR; ++r) isum[r] = _mm256_set1_epi32(MIN ? 0 : -32 * p.group_sum[(i0 + r) * groups + g]);
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 16, w += 64, top += 32) {
        prefetch_stream(w);
        prefetch_stream(top);
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(top));
        const __m256i u0 = _mm256_or_si256(_mm256_and_si256(v0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), top_mask));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 2), top_mask));
        const __m256i u2 = _mm256_or_si256(_mm256_and_si256(v1, low4), _mm256_and_si256(h, top_mask));
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi16(h, 2), top_mask));
        for (int r = 0; r < MR; ++r) {
          // pairs reach 2 * 63 * 127: two maddubs still sum exactly in int16
          const __m256i first = _mm256_add_epi16(_mm256_maddubs_epi16(u0, broadcast4(q[r] + kb)),
                                                 _mm256_maddubs_epi16(u1, broadcast4(q[r] + kb + 4)));
          const __m256i second = _mm256_add_epi16(_mm256_maddubs_epi16(u2, broadcast4(q[r] + kb + 8)),
                                                  _mm256_maddubs_epi16(u3, broadcast4(q[r] + kb + 12)));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(first, ones), _mm256_madd_epi16(second, ones)));
        }
      }
      w = top;
    } else {
      for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
      for (int64_t kb = k0; kb < k0 + wt.group; kb += 4, w += 32) {
        if ((kb & 4) == 0) prefetch_stream(w);
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
        __m256i magnitude = _mm256_sign_epi8(v, v);
        for (int r = 0; r < MR; ++r) {
          __m256i signed_q = _mm256_sign_epi8(broadcast4(q[r] + kb), v);
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_q), ones));
        }
      }
    }
    const __m256 scale = load_params(w, header, wt.params);
    const int64_t b = k0 / kGroupedActivationBlock;
    for (int r = 0; r < MR; ++r) {
      const int64_t i = i0 + r;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(scale, _mm256_set1_ps(p.x_scale[i * blocks + b])),
                               acc[r]);
      if constexpr (MIN)
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(p.x_min[i * groups + g]), load_params(w + param_bytes, header + 2 * kTileRows, wt.params),
                                 acc[r]);
    }
    w += MIN ? 2 * param_bytes : param_bytes;
  }
  const int valid = static_cast<int>(std::min<int64_t>(kTileRows, wt.n - t * kTileRows));
  const __m256 bias = load_bias(p.bias, t * kTileRows, valid);
  for (int r = 0; r < MR; ++r)
    store_row(p.out, p.out_dtype, (i0 + r) * p.out_stride + t * kTileRows, _mm256_add_ps(acc[r], bias), valid);
}

template <int BITS, bool MIN, bool CB = false>
void walk(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  constexpr int kRows = 4;  // 4 rows keep the int16 sums, one weight vector and its halves in 16 ymm
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    int64_t i = 0;
    for (; i + kRows <= p.m; i += kRows) rows_x_tile<BITS, MIN, CB, kRows>(p, i, t);
    switch (p.m - i) {
      case 3: rows_x_tile<BITS, MIN, CB, 3>(p, i, t); break;
      case 2: rows_x_tile<BITS, MIN, CB, 2>(p, i, t); break;
      case 1: rows_x_tile<BITS, MIN, CB, 1>(p, i, t); break;
      default: break;
    }
  }
}

// The reference's steps lane by lane: max|x| is exact in any order, x * inv is one rounding, and
// round_ps to nearest is nearbyint in the default rounding mode.
template <class T>
void quantize_rows(const T* x, int64_t r0, int64_t r1, int64_t k, int64_t group, const GroupedRows& out) {
  const int64_t blocks = k / kGroupedActivationBlock, groups = k / group;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = i * k + b * kGroupedActivationBlock;
      __m256 v[4];
      for (int u = 0; u < 4; ++u) v[u] = load8(x + first + 8 * u);
      __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                               _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
      const float amax = hmax(m);
      const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      out.x_scale[i * blocks + b] = scale;
      __m256i q[4];
      for (int u = 0; u < 4; ++u) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(v[u], _mm256_set1_ps(inv)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q[u] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
      }
      // int32 -> int8 in order: packs interleave 128-bit lanes, the permute puts them back.
      __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
      __m256i words2 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8);
      __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(words, words2), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q + first), bytes);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* q = out.q + i * k + g * group;
      __m256i sum = _mm256_setzero_si256();
      for (int64_t j = 0; j < group; j += 16)
        sum = _mm256_add_epi16(sum, _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j))));
      __m256i s32 = _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      const int32_t total = _mm_cvtsi128_si32(s);
      out.group_sum[i * groups + g] = total;
      out.x_min[i * groups + g] = -static_cast<float>(total) * out.x_scale[i * blocks + g * group / kGroupedActivationBlock];
    }
  }
}

}  // namespace

void grouped_quantize_rows(const void* x, DType x_dtype, int64_t r0, int64_t r1, int64_t k, int64_t group,
                           const GroupedRows& rows) {
  if (x_dtype == DType::f32) return quantize_rows(static_cast<const float*>(x), r0, r1, k, group, rows);
  quantize_rows(static_cast<const bf16*>(x), r0, r1, k, group, rows);
}

void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  if (p.w.bits == 8) {
    if (p.w.has_min) return walk<8, true>(p, tile_begin, tile_end);
    return walk<8, false>(p, tile_begin, tile_end);
  }
  if (p.w.bits == 6) {
    if (p.w.has_min) return walk<6, true>(p, tile_begin, tile_end);
    return walk<6, false>(p, tile_begin, tile_end);
  }
  if (p.w.codebook) return walk<4, false, true>(p, tile_begin, tile_end);
  if (p.w.has_min) return walk<4, true>(p, tile_begin, tile_end);
  walk<4, false>(p, tile_begin, tile_end);
}

}  // namespace shrike::avx2
