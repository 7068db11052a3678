// AVX2 + FMA: a K block's 16 accumulator lanes live in two registers, lo = pairs of K 0..15 and
// hi = pairs of K 16..31 (lane j += lane j + 8 is the lo + hi add). Weights are widened from bytes
// to 32-bit lanes (lane j = the pair 2j, 2j+1), split into even and odd elements and dequantized
// with one fma each.
#include <immintrin.h>

#include "common/pairs_avx2.h"
#include "weight_only/weight_only_kernels.h"

namespace shrike::avx2 {

namespace {

// The 16 weights of output c at K b + 16 * half .. + 15, dequantized with (s, o).
template <int BITS>
inline Pairs load_w(const WeightOnlyWeight& w, int64_t c, int64_t b, int half, __m256 s, __m256 o) {
  __m256i odd, even;
  if constexpr (BITS == 4) {
    const uint8_t* q = w.q + (c * w.k + b) / 2 + 8 * half;
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    even = _mm256_and_si256(v, _mm256_set1_epi32(15));
    odd = _mm256_srli_epi32(v, 4);
  } else {
    const uint8_t* q = w.q + c * w.k + b + 16 * half;
    __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    even = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    odd = _mm256_srli_epi32(v, 16);
  }
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(odd), s, o), _mm256_fmadd_ps(_mm256_cvtepi32_ps(even), s, o)};
}

template <int RB, int CB, typename XT, int BITS>
void block(const WeightOnlyProblem& p, int64_t r0, int64_t c0) {
  const int64_t k = p.w.k;
  const XT* x = static_cast<const XT*>(p.x) + r0 * k;
  __m256 lo[RB][CB], hi[RB][CB];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k; b += 32) {
    __m256 s[CB], o[CB];
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
      int64_t g = weight_only_group(p.w, c0 + c, b);
      s[c] = _mm256_set1_ps(p.w.scale[g]);
      o[c] = _mm256_set1_ps(p.w.offset[g]);
    }
    SHRIKE_UNROLL for (int half = 0; half < 2; ++half) {
      Pairs xp[RB];
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_pairs(x + r * k + b + 16 * half);
      SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
        Pairs wp = load_w<BITS>(p.w, c0 + c, b, half, s[c], o[c]);
        SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
          __m256& acc = half ? hi[r][c] : lo[r][c];
          acc = _mm256_fmadd_ps(xp[r].odd, wp.odd, acc);
          acc = _mm256_fmadd_ps(xp[r].even, wp.even, acc);
        }
      }
    }
  }
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c)
      weight_only_store(p, r0 + r, c0 + c, reduce8(_mm256_add_ps(lo[r][c], hi[r][c])));
}

}  // namespace

void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  with_weight_only_types(p, [&](auto x, auto bits) {
    walk_2x2(r0, r1, c0, c1, [&](auto rows, auto cols, int64_t r, int64_t c) {
      block<decltype(rows)::value, decltype(cols)::value, decltype(x), decltype(bits)::value>(p, r, c);
    });
  });
}

}  // namespace shrike::avx2
